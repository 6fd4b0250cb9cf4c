"""`ray job submit` against a running head: the embedded job runs to SUCCEEDED and leaves its files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
SETS = ["run.iterations=2", "prompts.per_iteration=2", "prompts.candidates=16", "prompts.keep=4",
        "sampler.steps=4", "explore.steps=3", "eval.every=1", "eval.prompts=2", "eval.seeds_per_prompt=2",
        "cluster.explorers.num_cpus=0.5", "cluster.learner.num_cpus=0.5"]


@pytest.fixture
def ray_head():
    # A private local head on 127.0.0.1 without token authentication (Ray 2.60 enables it for clusters
    # that in-process ray.init starts; `ray start` and `ray job submit` must agree, so both say disabled).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ports = ["--port", "6391", "--dashboard-host", "127.0.0.1", "--dashboard-port", "8291"]
    started = subprocess.run([RAY, "start", "--head", *ports, "--num-cpus", "2", "--disable-usage-stats",
                              "--temp-dir", temp], env=env, timeout=180, capture_output=True, text=True)
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    try:
        yield "http://127.0.0.1:8291", env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, timeout=120, capture_output=True)
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_job_submit_runs_the_embedded_job(ray_head, tmp_path):
    address, env = ray_head
    run_dir = tmp_path / "run"
    sets = [arg for item in SETS for arg in ("--set", item)]
    result = subprocess.run(
        [RAY, "job", "submit", "--address", address, "--working-dir", str(REPO),
         "--runtime-env", str(REPO / "cluster" / "runtime_env.yaml"), "--",
         sys.executable, "-m", "cluster.launch", "--config", "configs/embedded.yaml", "--run-dir", str(run_dir),
         *sets],
        env=env, timeout=900, capture_output=True, text=True, cwd=REPO,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "succeeded" in output.lower(), output[-4000:]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "samples.png", "reward_curve.png",
                 "final/transformer.safetensors", "final/sampling_transformer.safetensors", "checkpoint/meta.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and "eval_reward" in summary["last_eval"]
