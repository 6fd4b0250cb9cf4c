"""An operator's session through the CLI, on one local job: the launcher's lock, elastic explorers that do
what they say, Ctrl-C twice, and a run that ended before its first checkpoint continued with --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import tiny_sets

from cluster.launch import IN_RAY_JOB

REPO = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", IN_RAY_JOB)}


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def read_until(process: subprocess.Popen, predicate, lines: list[str], timeout: float = 300) -> str:
    deadline = time.time() + timeout
    for line in process.stdout:
        lines.append(line)
        if predicate(line):
            return line
        assert time.time() < deadline, "".join(lines)[-3000:]
    raise AssertionError("".join(lines)[-3000:])


@pytest.mark.ray
def test_one_job_per_run_directory_elastic_explorers_ctrl_c_twice_and_a_resume_without_checkpoint(tmp_path):
    run_dir = tmp_path / "exp"
    # checkpoint_every=0: the only checkpoint is the last iteration's, so an interrupted run has none
    job = cli("cluster.launch", "--run-dir", str(run_dir), *sets(*tiny_sets(
        "run.iterations=200", "run.checkpoint_every=0", "cluster.explorers.max=2", ray=True)))
    try:
        session(job, run_dir)
    finally:  # a failed assertion must not leave a 200-iteration job (and its local Ray) running
        if job.poll() is None:
            job.terminate()
            job.communicate(timeout=120)


def session(job: subprocess.Popen, run_dir: Path) -> None:
    lines: list[str] = []
    read_until(job, lambda line: line.startswith("iteration "), lines)

    # a second launcher on the same run directory is refused in one line, before Ray, naming the holder
    second = subprocess.run([sys.executable, "-m", "cluster.launch", "--resume", str(run_dir)], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"in use by a running job (pid {job.pid} on " in second.stderr and second.stderr.count("\n") == 1
    assert "run directory: " not in second.stdout  # nothing started

    # the control file within the job's room: the new explorer really joins
    steer = subprocess.run([sys.executable, "-m", "cluster.control", str(run_dir), "--explorers", "2"], cwd=REPO,
                           env=ENV, capture_output=True, text=True, timeout=120)
    assert steer.returncode == 0 and f"applied at the job's next iteration (launcher pid {job.pid}" in steer.stdout
    read_until(job, lambda line: "explorers 1 → 2" in line, lines)
    # (beyond the room: refused, tests/cluster/test_control.py)

    # Ctrl-C, and Ctrl-C again while it stops its local Ray
    job.send_signal(signal.SIGINT)
    time.sleep(0.5)
    if job.poll() is None:
        job.send_signal(signal.SIGINT)
    out = "".join(lines) + job.communicate(timeout=120)[0]
    assert job.returncode == 130, out[-3000:]
    stopped = [line for line in out.splitlines() if line.startswith("interrupted by SIGINT at iteration ")]
    assert len(stopped) == 1, out[-3000:]
    assert stopped[0].endswith(f"of 200; continue from iteration 0 (no checkpoint yet) with: "
                               f"python -m cluster.launch --resume {run_dir}")
    folder = next(line for line in out.splitlines() if line.startswith("local Ray's logs: "))
    subprocess.run(["rm", "-rf", folder.removeprefix("local Ray's logs: ").split("/session_latest")[0]], check=True)
    metrics = [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[:2] == [0, 1] and not (run_dir / "checkpoint").exists()

    # no checkpoint: --resume starts it again from iteration 0, the launch history kept
    again = cli("cluster.launch", "--resume", str(run_dir), *sets("run.iterations=2"))
    out = again.communicate(timeout=600)[0]
    assert again.returncode == 0, out[-3000:]
    assert f"note: {run_dir} has no checkpoint yet (its last start ended before the first one): starting it again " \
           "from iteration 0" in out
    assert [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    launches = [json.loads(line) for line in (run_dir / "launches.jsonl").read_text().splitlines()]
    assert [(x["resume"], x["from_iteration"], x["to_iteration"]) for x in launches] == [(False, 0, 200), (True, 0, 2)]
    assert json.loads((run_dir / "checkpoint" / "meta.json").read_text())["iteration"] == 2
