"""`python -m cluster.export` on an embedded run: what it refuses, what a failed write leaves, what it writes.

The embedded model fits no diffusers pipeline class, so its export carries its own `pipeline.py`: a fresh
process that cannot import this project loads it with `DiffusionPipeline.from_pretrained(DIR,
trust_remote_code=True)` and samples our sampler's image. A write that fails for real mid-export (a file
size limit, `RLIMIT_FSIZE`: what a full disk does to a write) leaves no partial folder and an earlier export
as it was. Every refusal is one `error:` line and exit code 2, before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from tiny import tiny_config

from cluster.export import main as export_main
from diffusion.config import EMBEDDED_MODEL
from diffusion.embedded.data import prompt_for
from learner.rollouts import Sampling, generate
from learner.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
PROMPT = prompt_for(7)
PROJECT_PACKAGES = ("actors", "bench", "cluster", "diffusion", "learner", "rewards", "weight_sync")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run dir, base model folder, trainer) of a one-iteration embedded run on a copy of the embedded
    model (a refusal test that failed would otherwise write into the committed folder)."""
    root = tmp_path_factory.mktemp("export_cli")
    model = root / "base-model"
    shutil.copytree(EMBEDDED_MODEL, model)
    run_dir = root / "exp"
    config = tiny_config(f"model.path={model}", "run.iterations=1", "training.lr=0.01")
    trainer = Trainer(config, run_dir)
    trainer.run(log=lambda _: None)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return run_dir, model, trainer


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def failed(capsys, argv: list[str]) -> list[str]:
    """The lines on stderr of an export that exits with code 2."""
    with pytest.raises(SystemExit) as exit_:
        export_main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.replace("\r", "\n").strip().splitlines()


def refused(capsys, argv: list[str]) -> str:
    """The `error:` line of an export refused before anything loads: it is all of stderr (a model load
    would have printed transformers' progress bar first)."""
    lines = failed(capsys, argv)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_the_embedded_export_loads_in_diffusers_and_samples_our_image(run, tmp_path, capsys):
    run_dir, _, trainer = run
    out = tmp_path / "digits-pipeline"
    export_main(["--run-dir", str(run_dir), "--out", str(out)])
    assert "trust_remote_code=True" in capsys.readouterr().out
    record = json.loads((out / "solrl_export.json").read_text())
    assert (record["policy"], record["iteration"], record["run_dir"]) == ("ema", 1, str(run_dir.resolve()))

    latents = torch.randn((1, *trainer.policy.latent_shape), generator=torch.Generator().manual_seed(7))
    torch.save(latents, tmp_path / "latents.pt")
    script = f"""
import sys
for name in {PROJECT_PACKAGES!r}:  # a diffusers user has none of this project: pipeline.py must not need it
    sys.modules[name] = None
import torch
from diffusers import DiffusionPipeline
pipe = DiffusionPipeline.from_pretrained({str(out)!r}, trust_remote_code=True)
latents = torch.load({str(tmp_path / "latents.pt")!r})
images = pipe({PROMPT!r}, num_inference_steps=3, latents=latents, output_type="pt").images
picture = pipe({PROMPT!r}, num_inference_steps=3).images[0]
torch.save({{"images": images, "class": type(pipe).__name__, "pil": (picture.mode, picture.size)}},
           {str(tmp_path / "images.pt")!r})
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = torch.load(tmp_path / "images.pt")
    assert result["class"] == "EmbeddedDigitsPipeline" and result["pil"] == ("L", (16, 16))
    with trainer.state.evaluated() as model:  # the exported policy: θ's EMA
        ours = generate(trainer.policy, model, None, PROMPT, [7], Sampling(3, "euler"), return_images=True).images
    assert result["images"].shape == ours.shape == (1, 1, 16, 16)
    torch.testing.assert_close(result["images"], ours, rtol=0, atol=1e-5)

    # A previous export is replaced (and only then), by a whole new one.
    export_main(["--run-dir", str(run_dir), "--out", str(out), "--policy", "theta"])
    assert json.loads((out / "solrl_export.json").read_text())["policy"] == "theta"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(out.name)) == [out.name]


def test_every_refusal_is_one_line_naming_the_fix(run, tmp_path, capsys):
    run_dir, model, _ = run
    before = tree(model), tree(run_dir)
    argv = ["--run-dir", str(run_dir), "--out"]
    assert "is the run directory" in refused(capsys, [*argv, str(run_dir)])
    assert "is inside the run directory" in refused(capsys, [*argv, str(run_dir / "final" / "pipe")])
    # Before: `error: ['<', 'D', 'i', ...]` (shutil's error list of a copy onto itself, as characters).
    assert "is the base model's folder" in refused(capsys, [*argv, str(model)])
    assert "is inside the base model's folder" in refused(capsys, [*argv, str(model / "exported")])
    assert "contains the base model's folder" in refused(capsys, [*argv, str(model.parent)])
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert "not a previous export" in refused(capsys, [*argv, str(notes)])
    assert "is a file" in refused(capsys, [*argv, str(notes / "todo.txt")])
    assert "is a file, not a folder" in refused(capsys, [*argv, str(notes / "todo.txt" / "pipe")])
    assert (tree(model), tree(run_dir)) == before and tree(notes) == {"todo.txt": hashlib.sha256(b"mine").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def limit_file_size(max_bytes: int) -> None:
    """Files of this process may not grow past `max_bytes`: a write beyond fails with EFBIG ("File too
    large"), as on a full disk, instead of the default SIGXFSZ killing the process."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@contextlib.contextmanager
def file_size_limit(max_bytes: int) -> Iterator[None]:
    """`limit_file_size` for the block, in this process."""
    soft, handler = resource.getrlimit(resource.RLIMIT_FSIZE)[0], signal.getsignal(signal.SIGXFSZ)
    limit_file_size(max_bytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_transformer_write_that_fails_leaves_nothing(run, tmp_path):
    """Through the CLI's process: the 2.4 MB transformer does not fit under 1 MiB (every copied component
    does), into a folder whose parent the export had to create."""
    run_dir, _, _ = run
    out = tmp_path / "parent" / "pipe"
    done = subprocess.run([sys.executable, "-m", "cluster.export", "--run-dir", str(run_dir), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: limit_file_size(1024 * 1024), env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.replace("\r", "\n").strip().splitlines()  # transformers' progress bars, then the error
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:] and errors[0].startswith(f"error: writing the export to {out} failed: "), lines
    assert "File too large" in errors[0]
    assert list(tmp_path.iterdir()) == []  # not the folder, nor its temporary sibling, nor the parent it made


def test_a_copy_that_fails_leaves_the_previous_export_as_it_was(run, tmp_path, capsys):
    """The text encoder's weights (117 kB) do not fit under 64 KiB: the copy fails, and says so in a sentence
    naming the file."""
    run_dir, _, _ = run
    out = tmp_path / "pipe"
    export_main(["--run-dir", str(run_dir), "--out", str(out)])
    before = tree(out)
    with file_size_limit(64 * 1024):
        lines = failed(capsys, ["--run-dir", str(run_dir), "--out", str(out), "--policy", "theta"])
    error = lines[-1]
    assert [line for line in lines if line.startswith("error:")] == [error]
    assert error.startswith(f"error: writing the export to {out} failed: [Errno 27] copying "
                            "text_encoder/model.safetensors: File too large"), error
    assert "['" not in error and "('" not in error
    assert tree(out) == before and [p.name for p in tmp_path.iterdir()] == ["pipe"]
