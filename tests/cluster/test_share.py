"""What a user shares: an export of a run whose base came from the hub holds only what the pipeline loads, a
model card the hub parses (licence inherited, metrics before and after, the launch commands), and the sample
grid; `--push-to-hub` hands huggingface_hub exactly that folder; kept checkpoints export by iteration."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import diffusers
import pytest
import yaml
from hub_cache import cache_repo, folder_files
from huggingface_hub import ModelCard
from huggingface_hub.utils import filter_repo_objects
from tiny import tiny_family_config

from cluster import launch
from cluster.config.preflight import check_inputs
from cluster.export import main as export_main
from cluster.export import push_to_hub
from cluster.reports.figures import save_image_grid
from cluster.reports.summary import before_after
from diffusion.loading import listed_components, pipeline_patterns
from learner.export import EXPORT_RECORD
from learner.kept_checkpoints import kept_checkpoints
from learner.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
BASE_CARD = """---
license: other
license_name: tiny-community-licence
license_link: LICENSE.md
tags:
- text-to-image
---
# Tiny SD3
"""
DOCUMENTS = {"README.md", "samples.png", EXPORT_RECORD}


@pytest.fixture
def hub_run(hub_cache, tiny_folder, tmp_path):
    """(run dir, the base's snapshot, trainer) of a 2-iteration run of the tiny SD3 given by repo id, every
    checkpoint kept, launched through the launcher's own records (config.yaml with the id, launches.jsonl)."""
    extra = {"sd3_tiny.safetensors": b"a single-file checkpoint", "README.md": BASE_CARD.encode(),
             "LICENSE.md": b"the licence", "transformer/diffusion_pytorch_model.fp16.safetensors": b"a variant"}
    snapshot = cache_repo(hub_cache, "solrl-test/tiny-sd3", {**folder_files(tiny_folder("sd3")), **extra})
    given = tiny_family_config("solrl-test/tiny-sd3", "run.iterations=2", "run.checkpoint_every=1",
                               "run.keep_every=1", "eval.every=1", "training.lr=0.01")
    checked = check_inputs(given)
    run_dir = tmp_path / "run"
    trainer = Trainer(checked.config, run_dir)
    args = argparse.Namespace(resume=None, checkpoint="latest", config="configs/embedded.yaml",
                              set=["model.path=solrl-test/tiny-sd3", "run.iterations=2"])
    launch.record_launch(run_dir, given, args, 0, None, checked.sources)
    trainer.evaluate_base()
    trainer.run(log=lambda _: None)
    base, trained = trainer.sample_images(2, base=True), trainer.sample_images(2)
    save_image_grid(before_after(base, trained, 2), rows=trained.shape[0] // 2, path=run_dir / "samples.png")
    return run_dir, snapshot, trainer


def test_an_export_of_a_hub_base_holds_the_pipeline_and_a_card_the_hub_parses(hub_run, tmp_path, capsys):
    run_dir, snapshot, _ = hub_run
    out = tmp_path / "shared"
    export_main(["--run-dir", str(run_dir), "--out", str(out)])
    assert "model card" in capsys.readouterr().out
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    include, exclude = pipeline_patterns(listed_components(json.loads((out / "model_index.json").read_text())))
    loaded = set(filter_repo_objects(files, allow_patterns=include, ignore_patterns=exclude))
    assert set(files) - loaded == DOCUMENTS  # nothing the pipeline does not load, but the card, grid and record
    assert not any(name in files for name in ("sd3_tiny.safetensors", "LICENSE.md",
                                              "transformer/diffusion_pytorch_model.fp16.safetensors"))
    assert not any(p.is_symlink() for p in out.rglob("*"))  # the snapshot's links became files
    pipe = diffusers.DiffusionPipeline.from_pretrained(out)
    assert type(pipe).__name__ == "StableDiffusion3Pipeline"

    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "solrl-test/tiny-sd3" and card.data.library_name == "diffusers"
    assert (card.data.license, card.data.license_name, card.data.license_link) == (
        "other", "tiny-community-licence", "https://huggingface.co/solrl-test/tiny-sd3/blob/main/LICENSE.md")
    assert card.data.pipeline_tag == "text-to-image"
    assert {"sol-rl", "reward-jpeg_compressibility", "lora"} <= set(card.data.tags)
    base = json.loads((run_dir / "base_eval.json").read_text())["eval_reward"]
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert f"| `eval_reward` | {base:.4f} | {last['eval_reward']:.4f} |" in card.text
    assert "evaluated after 2 iterations" in card.text and "trained for 2 iterations" in card.text
    assert f"commit `{snapshot.name[:12]}`" in card.text and "![Base model" in card.text
    assert ("python -m cluster.launch --config configs/embedded.yaml --run-dir runs/run --set "
            "model.path=solrl-test/tiny-sd3 --set run.iterations=2") in card.text
    assert (out / "samples.png").read_bytes() == (run_dir / "samples.png").read_bytes()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["path"] == "solrl-test/tiny-sd3"
    record = json.loads((out / EXPORT_RECORD).read_text())
    assert (record["base_model"], record["base_commit"], record["iteration"]) == ("solrl-test/tiny-sd3",
                                                                                  snapshot.name, 2)


def test_a_kept_checkpoint_exports_by_its_iteration(hub_run, tmp_path, capsys):
    run_dir, _, _ = hub_run
    assert sorted(kept_checkpoints(run_dir)) == [1, 2]
    # the kept files are the rotating checkpoint's own (hard links: no second copy of the bytes)
    latest = run_dir / "checkpoint" / "theta.safetensors"
    kept = run_dir / "kept" / "iteration-000002" / "theta.safetensors"
    assert os.path.samefile(latest, kept) or latest.read_bytes() == kept.read_bytes()
    export_main(["--run-dir", str(run_dir), "--out", str(tmp_path / "first"), "--checkpoint", "1"])
    first = json.loads((tmp_path / "first" / EXPORT_RECORD).read_text())
    assert first["iteration"] == 1 and first["checkpoint"] == str((run_dir / "kept" / "iteration-000001").resolve())
    assert "evaluated after 1 iteration)" in (tmp_path / "first" / "README.md").read_text()
    with pytest.raises(SystemExit):
        export_main(["--run-dir", str(run_dir), "--out", str(tmp_path / "none"), "--checkpoint", "7"])
    assert ("error: --checkpoint 7: " in capsys.readouterr().err and not (tmp_path / "none").exists())


def test_keep_every_must_be_a_multiple_of_checkpoint_every():
    from cluster.config.loading import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"run\.keep_every \(3\) must be a multiple of run\.checkpoint_every \(2\)"):
        load_config("configs/embedded.yaml", ["run.checkpoint_every=2", "run.keep_every=3"])


class RecordingHub:
    """Where huggingface_hub's HfApi would reach the hub (no network here): the calls and their arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def create_repo(self, *args, **kwargs):
        self.calls.append(("create_repo", args, kwargs))

    def upload_folder(self, *args, **kwargs):
        self.calls.append(("upload_folder", args, kwargs))
        return argparse.Namespace(commit_url="https://huggingface.co/org/name/commit/abc")


def test_push_to_hub_uploads_the_export_folder_without_its_local_record(hub_run, tmp_path):
    run_dir, _, _ = hub_run
    out = tmp_path / "shared"
    export_main(["--run-dir", str(run_dir), "--out", str(out)])
    hub = RecordingHub()
    assert push_to_hub(out, "org/name", private=True, api=hub) == "https://huggingface.co/org/name/commit/abc"
    assert hub.calls == [
        ("create_repo", ("org/name",), {"repo_type": "model", "private": True, "exist_ok": True}),
        ("upload_folder", (), {"repo_id": "org/name", "repo_type": "model", "folder_path": str(out),
                               "ignore_patterns": [EXPORT_RECORD],
                               "commit_message": "Sol-RL export: the ema policy after 2 iterations"})]


def test_push_to_hub_offline_is_refused_before_the_export(hub_cache, tmp_path):
    done = subprocess.run([sys.executable, "-m", "cluster.export", "--run-dir", str(tmp_path), "--out",
                           str(tmp_path / "out"), "--push-to-hub", "org/name"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --push-to-hub org/name: HF_HUB_OFFLINE=1 forbids uploading; unset it, or export now and push later "
        "with the hub's `hf upload REPO FOLDER`")
