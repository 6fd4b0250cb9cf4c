"""An operator's session through the CLI, on one local job: the launcher's lock, elastic explorers that do
what they say, Ctrl-C twice, and a run that ended before its first checkpoint continued with --resume. That
resume, which takes the run directory's config (two rewards served by a scorer actor), is also the clean local
run to the end: room for every actor, its Ray folder removed, the summary, costs and where the run is printed."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny import tiny_sets

from bench.plan import load_costs
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


def ray_folders_of(run_dir: Path) -> list[str]:
    """The local Ray folders whose launcher ran `run_dir` (other launches, in parallel tests, have their own)."""
    mine = []
    for folder in glob.glob("/tmp/solrl-ray-*"):
        with contextlib.suppress(OSError, ValueError):  # another launch's folder, being made or removed
            if json.loads(Path(folder, "launcher.json").read_text())["run_dir"] == str(run_dir):
                mine.append(folder)
    return mine


@pytest.mark.ray
def test_one_job_per_run_directory_elastic_explorers_ctrl_c_twice_and_a_resume_without_checkpoint(tmp_path):
    run_dir = tmp_path / "exp"
    # checkpoint_every=0: the only checkpoint is the last iteration's, so an interrupted run has none. The clean
    # run's config, which the resume takes: two rewards (so no accuracy) served by a scorer, evaluated (eval.every)
    # for the summary line. Its 1 CPU and the learner's and two explorers' 0.5 need a local Ray of 2.5 CPUs, above
    # its floor of 2: a room leaving out the scorer or the explorer cluster.control adds would show
    job = cli("cluster.launch", "--run-dir", str(run_dir), *sets(*tiny_sets(
        "run.iterations=200", "run.checkpoint_every=0", "cluster.explorers.max=2", "cluster.scorers.count=1",
        "reward.weights={digit_alignment: 1.0, jpeg_compressibility: 0.5}", "eval.every=1", ray=True)))
    try:
        session(job, run_dir)
    finally:  # a failed assertion must not leave a 200-iteration job (and its local Ray) running
        if job.poll() is None:
            job.terminate()
            job.communicate(timeout=120)


def session(job: subprocess.Popen, run_dir: Path) -> None:
    lines: list[str] = []
    read_until(job, lambda line: line.startswith("iteration "), lines)

    # a second launcher on the same run directory is refused in one line, before its preflight and Ray, naming
    # the holder
    second = subprocess.run([sys.executable, "-m", "cluster.launch", "--resume", str(run_dir)], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"in use by a running job (pid {job.pid} on " in second.stderr and second.stderr.count("\n") == 1
    assert "run directory: " not in second.stdout and " memory " not in second.stdout  # nothing started or checked

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

    # and it ran to the end clean: where the run is (first and last), what the driver started as the dashboard
    # names it, the progress line, a summary line for a reward without an accuracy, no Ray folder left
    assert out.count(f"run directory: {run_dir}") == 2
    assert ": solrl-learner-0..0, solrl-explorer-0..0, solrl-scorer-0..0" in out, out[-3000:]
    assert "iteration 2/2 (100%)" in out and "elapsed, done" in out
    assert "held-out reward " in out and "accuracy" not in out.split("held-out reward ")[-1].splitlines()[0]
    assert not ray_folders_of(run_dir)  # its own Ray folder is gone (others' are not ours to judge)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["samples"] == str(run_dir / "samples.png")
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"reward_digit_alignment", "reward_jpeg_compressibility"} <= metrics.keys()
    # the run's measured phase costs, in the format the capacity model reads (python -m bench.plan --costs)
    costs = load_costs(run_dir / "costs.json")
    assert costs.explore_s_per_sample_step > 0 and costs.regen_s_per_sample_step > 0 and costs.train_s_per_sample > 0
    assert summary["costs"] == str(run_dir / "costs.json")
