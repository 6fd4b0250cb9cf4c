"""`ray job submit` against a head started as the README says: token authentication on (Ray 2.60's
default), the virtualenv first on PATH (so the job's `python` is the project's), the job runs to
SUCCEEDED and leaves its files in the absolute run directory, and knows it runs in a Ray job (where a relative
run directory is refused: tests/cluster/test_launch.py).

The head is this test's own: its own temporary folder, free ports, its own process group — stopped by
signalling exactly that group, never `ray stop` (which would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest.mock import ANY

import psutil
import pytest
import yaml
from hub_cache import cache_repo, folder_files

from diffusion.config import EMBEDDED_MODEL
from rewards.digit_classifier import DEFAULT_DIR as CLASSIFIER_DIR

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
SETS = ["run.iterations=2", "prompts.per_iteration=2", "prompts.candidates=16", "prompts.keep=4",
        "sampler.steps=4", "explore.steps=3", "eval.every=1", "eval.prompts=2", "eval.seeds_per_prompt=2",
        "cluster.explorers.num_cpus=0.5", "cluster.learner.num_cpus=0.5"]
PORT_FLAGS = ["--port", "--dashboard-port", "--ray-client-server-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port",
              "--node-manager-port", "--object-manager-port"]


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def group_members(pgid: int) -> list[psutil.Process]:
    alive = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


@pytest.fixture
def ray_head():
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    token = Path(temp) / "auth_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # what `source .venv/bin/activate` does
    env.pop("RAY_ADDRESS", None)
    ports = free_ports(len(PORT_FLAGS))
    flags = [x for flag, port in zip(PORT_FLAGS, ports, strict=True) for x in (flag, str(port))]
    log = open(Path(temp) / "head.log", "w")  # noqa: SIM115 (closed in the finally below)
    head = subprocess.Popen([RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
                             "--dashboard-host", "127.0.0.1", "--num-cpus", "2", "--num-gpus", "1",
                             "--disable-usage-stats",
                             "--temp-dir", temp, *flags], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 180
        while "will now block" not in (Path(temp) / "head.log").read_text():
            assert head.poll() is None and time.time() < deadline, (Path(temp) / "head.log").read_text()[-3000:]
            time.sleep(1)
        yield f"http://127.0.0.1:{ports[1]}", {**env, "SOLRL_TEST_GCS": f"127.0.0.1:{ports[0]}"}
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        deadline = time.time() + 8
        while group_members(head.pid) and time.time() < deadline:
            time.sleep(1)
        if group_members(head.pid):  # `ray start --block` shuts down slowly; the rest gets SIGKILL
            os.killpg(head.pid, signal.SIGKILL)
            time.sleep(2)
        head.wait(timeout=30)
        log.close()
        left = group_members(head.pid)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"processes of the test's Ray left behind: {[p.pid for p in left]}"


def submit(address: str, env: dict, *args: str, job: list[str] = (),
           runtime_env: Path = REPO / "cluster" / "runtime_env.yaml") -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAY, "job", "submit", "--address", address, "--working-dir", str(REPO), *job,
         "--runtime-env", str(runtime_env), "--", "python", "-m", "cluster.launch", *args],
        env=env, timeout=900, capture_output=True, text=True, cwd=REPO)


def runtime_env_with(tmp_path: Path, **env_vars: str) -> Path:
    """The shipped runtime env with these variables added, as docs/operations.md tells a user to pass an HF cache."""
    shipped = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    shipped["env_vars"] = {**shipped.get("env_vars", {}), **env_vars}
    path = tmp_path / "runtime_env.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


def test_ray_job_submit_runs_the_embedded_job_with_authentication_on(ray_head, tmp_path, tiny_folder):
    address, env = ray_head
    without_token = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run([RAY, "job", "list", "--address", address], env={**without_token, "HOME": str(tmp_path)},
                             timeout=120, capture_output=True, text=True)
    assert refused.returncode != 0 and "Authentication required" in refused.stdout + refused.stderr

    # the preflight measures the placement against this cluster (2 CPUs, 1 logical GPU): the 8-GPU preset does not
    # fit; its reward is not cached (inputs fail), and still every row is evaluated and printed
    check = subprocess.run([sys.executable, "-m", "cluster.check", "--config", "configs/flux_dev.yaml", "--set",
                            f"model.path={tiny_folder('flux')}", "--set", "explore.min_dim=0"],
                           env={**env, "RAY_ADDRESS": env["SOLRL_TEST_GCS"], "HF_HUB_CACHE": str(tmp_path / "empty")},
                           timeout=300, capture_output=True, text=True, cwd=REPO)
    assert check.returncode == 1, (check.stdout + check.stderr)[-3000:]
    rows = check.stdout.splitlines()
    assert [row.split()[:2] for row in rows] == [["FAIL", "inputs"], ["FAIL", "resources"], ["ok", "learners"],
                                                 ["ok", "backend"], ["ok", "plan"], ["ok", "memory"], ["ok", "shm"]], \
        check.stdout
    assert rows[0].startswith("FAIL  inputs     reward.options.hpsv2.path: xswu/HPSv2 is not in the Hugging Face cache")
    assert (f"FAIL  resources  bundles need 8 GPU, 64 CPU; the cluster at {env['SOLRL_TEST_GCS']} has 1 GPU, 2 CPU: "
            "add nodes or lower cluster.*.num_gpus") in check.stdout
    # the GPU's memory is read on the cluster by a one-GPU task: here a logical GPU, with no CUDA device behind it
    assert rows[5].endswith(f"not compared with a GPU's memory (the cluster at {env['SOLRL_TEST_GCS']} has logical "
                            "GPUs without a CUDA device behind them)"), rows[5]

    run_dir = tmp_path / "run"
    # the model and the reward's classifier by repo id, from a hub cache the job is pointed at, offline
    cache = tmp_path / "hf-cache"
    model = cache_repo(cache, "solrl-test/embedded-digits",
                       {**folder_files(EMBEDDED_MODEL), "embedded.safetensors": b"a single-file checkpoint"})
    cache_repo(cache, "solrl-test/digit-classifier", folder_files(CLASSIFIER_DIR))
    by_id = ["model.path=solrl-test/embedded-digits", "reward.options.digit_alignment.path=solrl-test/digit-classifier"]
    # as the README says: the submission id names the run, the metadata holds its directory
    job_id = f"solrl-{run_dir.name}-{secrets.token_hex(3)}"
    result = submit(address, env, "--config", "configs/embedded.yaml", "--run-dir", str(run_dir),
                    *[arg for item in [*SETS, *by_id] for arg in ("--set", item)],
                    job=["--submission-id", job_id, "--metadata-json", json.dumps({"run_dir": str(run_dir)})],
                    runtime_env=runtime_env_with(tmp_path, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "succeeded" in output.lower(), output[-4000:]
    assert output.count(f"run directory: {run_dir}") == 2  # at the start and at the end
    for name in ("config.yaml", "launches.jsonl", "metrics.jsonl", "summary.json", "samples.png", "reward_curve.png",
                 "final/transformer/diffusion_pytorch_model.safetensors", "final/lora/pytorch_lora_weights.safetensors",
                 "final/sampling_transformer.safetensors", "checkpoint/meta.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and "eval_reward" in summary["last_eval"]
    # the job's id, read from the variable Ray sets in a job's driver: the one that makes the launcher refuse a
    # relative run directory there (tests/cluster/test_launch.py), which a submission of its own would only repeat
    assert summary["ray_job"] == job_id
    launch = json.loads((run_dir / "launches.jsonl").read_text())
    assert launch["ray_job"] == job_id and launch["ray_namespace"].startswith(f"solrl-{run_dir.name}-")
    assert [(s["field"], s["repo"], s["commit"]) for s in launch["hub_sources"]] == [
        ("reward.options.digit_alignment.path", "solrl-test/digit-classifier", ANY),
        ("model.path", "solrl-test/embedded-digits", model.name)]
    assert "solrl-test/embedded-digits" in (run_dir / "config.yaml").read_text()  # the id, not the snapshot
    assert "Ray dashboard: http://127.0.0.1:" in output and "Grafana dashboard 'Sol-RL job'" in output
    listed = subprocess.run([RAY, "job", "list", "--address", address], env=env, timeout=120, capture_output=True,
                            text=True)
    assert job_id in listed.stdout and str(run_dir) in listed.stdout, listed.stdout[-3000:]
    assert summary["run_dir"] == str(run_dir) and summary["final"]["transformer"] == str(run_dir / "final" /
                                                                                         "transformer")
