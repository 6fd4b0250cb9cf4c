"""`ray job submit` against a running head: the embedded job runs to SUCCEEDED and leaves its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
SETS = ["run.iterations=2", "prompts.per_iteration=2", "prompts.candidates=16", "prompts.keep=4",
        "sampler.steps=4", "explore.steps=3", "eval.every=1", "eval.prompts=2", "eval.seeds_per_prompt=2",
        "cluster.explorers.num_cpus=0.5", "cluster.learner.num_cpus=0.5"]


@pytest.fixture
def ray_head(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    ports = ["--port", "6391", "--dashboard-host", "127.0.0.1", "--dashboard-port", "8291"]
    subprocess.run([RAY, "start", "--head", *ports, "--num-cpus", "2", "--disable-usage-stats",
                    "--temp-dir", str(tmp_path / "ray")], check=True, env=env, timeout=180, capture_output=True)
    try:
        yield "http://127.0.0.1:8291", env
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, timeout=120, capture_output=True)


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
    assert "SUCCEEDED" in output, output[-4000:]
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "samples.png", "reward_curve.png",
                 "final/transformer.safetensors", "final/sampling_transformer.safetensors", "checkpoint/meta.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and "eval_reward" in summary["last_eval"]
