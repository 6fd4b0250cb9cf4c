"""The whole job on each model family's tiny real pipeline, in latent space, on a real local Ray.

For FLUX.1, SANA and Qwen-Image folders (`diffusion.tiny`), with the JPEG-compressibility reward and a prompt
file: two explorers give bitwise the single-process trainer's weights and export the LoRA beside the
transformer (SD3.5's family is the embedded world's, on Ray in every job of test_cluster.py). Qwen-Image's job
is the command line's (`python -m cluster.launch`, its own local Ray), scaled from two explorers to one between
its iterations: the family with the most family hooks (a negative prompt, padded prompts, rescaled guidance)
runs to the end the way a user runs it; the launcher's path does not depend on the family past the config,
which `cluster.check` reads per family (tests/cluster/test_check.py). Resumes per family:
tests/learner/test_export.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jobs import assert_same, run_job, single_process
from safetensors.torch import load_file
from tiny import tiny_family_config, tiny_family_sets

from cluster.launch import IN_RAY_JOB
from cluster.runtime.control_file import write_control

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("no_leftover_actors")]

# Qwen-Image's job is the launcher's (below), on two then one explorer: a job's cost is mostly starting its actors.
# SD3.5's is every job of test_cluster.py: the embedded world is an `SD3Transformer2DModel` pipeline (the sd3
# family), one or two explorers bitwise the single process in each; its tiny folder's three text encoders are
# tests/diffusion/test_loading.py's parity and test_export's resume and export.
IN_PROCESS_FAMILIES = ["flux", "sana"]


@pytest.fixture(scope="module")
def family_reference(tiny_folder):
    """`family_reference(family)`: the single-process trainer's weights on that family's tiny folder, computed
    once (the explorer count does not enter the single process)."""
    cache = {}

    def reference(family: str):
        if family not in cache:
            cache[family] = single_process(tiny_family_config(tiny_folder(family), ray=True))
        return cache[family]

    return reference


@pytest.mark.parametrize("family", IN_PROCESS_FAMILIES)
def test_two_explorers_give_the_single_process_weights(family, tiny_folder, family_reference, local_ray, tmp_path):
    cfg = tiny_family_config(tiny_folder(family), "cluster.explorers.count=2", ray=True)
    weights, history = run_job(cfg, tmp_path / family)
    assert len(history) == cfg.run.iterations and not any(m.get("skipped") for m in history)
    assert (tmp_path / family / "final" / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert_same(weights, family_reference(family))


def test_the_launcher_runs_qwen_image_on_two_then_one_explorer_to_the_single_process_weights(
        tiny_folder, family_reference, tmp_path):
    """Iteration 0 on two explorers, iteration 1 on one (the control file, as an operator scales a job down; a
    removed explorer stops at once, where an added one would join only once loaded): the weights are bitwise
    the single process's, so each count gave its iteration exactly the single process's update."""
    folder, run_dir = tiny_folder("qwen_image"), tmp_path / "run"
    run_dir.mkdir()
    write_control(run_dir, hold_before=1)
    sets = tiny_family_sets(folder, "cluster.explorers.count=2")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", IN_RAY_JOB)}
    run = subprocess.Popen([sys.executable, "-m", "cluster.launch", "--run-dir", str(run_dir),
                            *[arg for item in sets for arg in ("--set", item)]], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        for line in run.stdout:
            lines.append(line)
            if "held before iteration 1" in line:
                write_control(run_dir, explorers=1, hold_before=None)
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    out = "".join(lines)
    assert run.returncode == 0, out[-3000:]
    assert "explorers 2 → 1" in out, out[-3000:]
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["explorers"] for m in history] == [2, 1]  # tiny_family_sets: 2 iterations
    assert not any(m.get("skipped") for m in history)
    assert (run_dir / "final" / "lora" / "pytorch_lora_weights.safetensors").is_file()
    weights = load_file(str(run_dir / "final" / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert_same(weights, family_reference("qwen_image"))
