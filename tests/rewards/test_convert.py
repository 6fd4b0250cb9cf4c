"""python -m rewards.convert: safetensors twins of pickled checkpoints; pickles holding code are refused unrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rewards.convert import main

REPO = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"visual.proj": torch.randn(8, 4, generator=generator),
            "logit_scale": torch.tensor(4.6),
            "text.token_embedding.weight": torch.randn(16, 8, generator=generator).half()}


def test_converts_wrapped_and_bare_state_dicts_and_reports_names_counts_and_bytes(tmp_path, capsys):
    wrapped, bare = tmp_path / "HPS_v2.1_compressed.pt", tmp_path / "ImageReward.pt"
    torch.save({"epoch": 3, "state_dict": state(0)}, wrapped)
    torch.save(state(1), bare)
    assert main([str(wrapped), str(bare)]) == 0
    out = capsys.readouterr().out
    for pickled, seed in ((wrapped, 0), (bare, 1)):
        twin = pickled.with_suffix(".safetensors")
        tensors = load_file(twin)
        assert tensors.keys() == state(seed).keys()
        for name, tensor in state(seed).items():
            assert tensors[name].dtype == tensor.dtype and torch.equal(tensors[name], tensor)
        assert f"wrote {twin}: 3 tensors, {twin.stat().st_size} bytes from {pickled}" in out


def test_an_existing_twin_is_kept_unless_forced_and_check_compares_it(tmp_path, capsys):
    pickled = tmp_path / "model.pth"
    torch.save(state(0), pickled)
    assert main([str(pickled)]) == 0
    torch.save(state(1), pickled)  # the pickle changes: the twin is now stale
    assert main([str(pickled)]) == 0
    assert "kept" in capsys.readouterr().out
    assert torch.equal(load_file(pickled.with_suffix(".safetensors"))["visual.proj"], state(0)["visual.proj"])
    assert main(["--check", str(pickled)]) == 1
    assert "differs" in capsys.readouterr().out
    assert main(["--force", str(pickled)]) == 0
    assert torch.equal(load_file(pickled.with_suffix(".safetensors"))["visual.proj"], state(1)["visual.proj"])
    assert main(["--check", str(pickled)]) == 0
    assert "equal" in capsys.readouterr().out
    save_file({"visual.proj": state(1)["visual.proj"]}, pickled.with_suffix(".safetensors"))
    assert main(["--check", str(pickled)]) == 1
    assert "names differ" in capsys.readouterr().out
    pickled.with_suffix(".safetensors").unlink()
    assert main(["--check", str(pickled)]) == 1


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    evil, marker = tmp_path / "ImageReward.pt", tmp_path / "code-ran"
    torch.save({"state_dict": {"weight": torch.zeros(2)}, "payload": Payload(marker)}, evil)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "rewards.convert", str(evil)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 2, result.stderr
    assert "weights_only=True" in result.stderr and str(evil) in result.stderr
    assert not marker.exists()
    assert not evil.with_suffix(".safetensors").exists()
    # The payload is live: a full unpickle would have run it.
    torch.load(evil, weights_only=False)
    assert marker.exists()


def test_forcing_over_a_refused_pickle_keeps_the_existing_twin(tmp_path, capsys):
    pickled, marker = tmp_path / "model.pt", tmp_path / "code-ran"
    torch.save(state(0), pickled)
    assert main([str(pickled)]) == 0
    torch.save({"state_dict": state(1), "payload": Payload(marker)}, pickled)
    assert main(["--force", str(pickled)]) == 2
    assert "refused" in capsys.readouterr().err
    assert not marker.exists()
    assert torch.equal(load_file(pickled.with_suffix(".safetensors"))["visual.proj"], state(0)["visual.proj"])
    assert not list(tmp_path.glob("*.previous"))


def test_every_file_is_attempted_and_any_refusal_exits_2(tmp_path, capsys):
    good, not_a_state_dict = tmp_path / "good.pt", tmp_path / "list.pt"
    torch.save(state(0), good)
    torch.save([1, 2, 3], not_a_state_dict)
    already = tmp_path / "weights.safetensors"
    save_file(state(0), already)
    missing = tmp_path / "missing.pt"
    assert main([str(not_a_state_dict), str(missing), str(already), str(good)]) == 2
    err = capsys.readouterr().err
    assert "does not hold a state dict" in err
    assert f"{missing}: no such file" in err
    assert "not a pickled checkpoint" in err
    assert good.with_suffix(".safetensors").is_file()
    assert not not_a_state_dict.with_suffix(".safetensors").exists()
    with pytest.raises(SystemExit):
        main([])
