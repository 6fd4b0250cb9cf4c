"""The launcher as an operator meets it: where runs land, its local Ray's lifetime, Ctrl-C and SIGTERM (a clean
run to the end, its Ray folder removed: the resume that ends test_operator_session)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tiny import tiny_sets

from cluster.config.loading import ConfigError, load_config
from cluster.launch import IN_RAY_JOB, run_directory

REPO = Path(__file__).resolve().parents[2]
SMALL = tiny_sets("eval.every=1", ray=True)


# ---- where runs land ------------------------------------------------------------------------------------
def test_run_directories_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(IN_RAY_JOB, raising=False)
    config = load_config(None, ["run.name=exp"])
    assert run_directory("/shared/runs/a", config) == Path("/shared/runs/a")
    assert run_directory("a/b", config) == tmp_path / "a" / "b"
    default = run_directory(None, config)
    assert default.parent == tmp_path / "runs" and default.name.startswith("exp-")
    rooted = load_config(None, ["run.root=/shared/runs"])
    assert run_directory("a", rooted) == Path("/shared/runs/a")
    with pytest.raises(ConfigError, match=r"run\.root \(runs\) must be an absolute path"):
        run_directory("a", load_config(None, ["run.root=runs"]))


def test_a_relative_run_directory_is_refused_inside_a_ray_job(monkeypatch):
    monkeypatch.setenv(IN_RAY_JOB, "{}")
    config = load_config(None, [])
    for given in ("runs/x", None):
        with pytest.raises(ConfigError, match=r"inside a Ray job it would land in Ray's temporary copy .* "
                                              r"pass an absolute path on shared storage .* or set run\.root="):
            run_directory(given, config)
    assert run_directory("/shared/x", config) == Path("/shared/x")
    assert run_directory("x", load_config(None, ["run.root=/shared"])) == Path("/shared/x")


# ---- the local Ray's lifetime ---------------------------------------------------------------------------
def launch(run_dir: Path, *sets: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", IN_RAY_JOB)}
    args = [arg for item in [*SMALL, *sets] for arg in ("--set", item)]
    return subprocess.Popen([sys.executable, "-m", "cluster.launch", "--run-dir", str(run_dir), *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.ray
def test_a_signalled_launcher_takes_its_local_ray_down(tmp_path):
    """Killed while training (SIGTERM; Ctrl-C, twice: test_operator_session), the launcher shuts its local
    Ray down: no process of it is left (an orphaned dashboard agent would hold its port), its logs' folder is
    kept and named, and it says where the run stopped and how to continue."""
    signum = signal.SIGTERM
    run = launch(tmp_path / "run", "run.iterations=200")
    lines: list[str] = []
    deadline = time.time() + 300
    for line in run.stdout:
        lines.append(line)
        if line.startswith("iteration "):
            break
        assert time.time() < deadline, "".join(lines)[-3000:]
    descendants = psutil.Process(run.pid).children(recursive=True)
    assert len(descendants) >= 4, [p.name() for p in descendants]  # gcs, raylet, agents, actors
    run.send_signal(signum)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, out[-3000:]  # unwound through the launcher's own handler
    stopped = [line for line in out.splitlines() if line.startswith("interrupted by SIGTERM at iteration ")]
    assert stopped and stopped[0].endswith(f"with: python -m cluster.launch --resume {tmp_path / 'run'}"), out[-3000:]
    assert "of 200; continue from the checkpoint of iteration " in stopped[0]  # checkpoint_every=1 (tests/tiny.py)
    _, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]
    kept = [line for line in out.splitlines() if line.startswith("local Ray's logs: ")]
    assert kept, out[-3000:]
    folder = kept[0].removeprefix("local Ray's logs: ").split("/session_latest")[0]
    assert Path(folder, "session_latest", "logs").is_dir()
    subprocess.run(["rm", "-rf", folder], check=True)


@pytest.mark.ray
def test_a_learner_killed_in_the_base_evaluation_ends_with_the_command_that_continues(tmp_path):
    """Before the first checkpoint: the launcher names the dead rank and how to go on (the resume then starts
    the run again: test_operator_session)."""
    # a base evaluation long enough to be killed in (2 prompts × 256 seeds × 40 steps)
    run = launch(tmp_path / "run", "run.iterations=200", "eval.seeds_per_prompt=256", "eval.steps=40")
    lines: list[str] = []
    for line in run.stdout:
        lines.append(line)
        if line.startswith("evaluating the base model"):
            break
    learner = next(p for p in psutil.Process(run.pid).children(recursive=True)
                   if "Learner" in " ".join(p.cmdline()) and "Explorer" not in " ".join(p.cmdline()))
    learner.kill()
    out = "".join(lines) + run.communicate(timeout=300)[0]
    assert run.returncode == 1, out[-3000:]
    last = [line for line in out.splitlines() if line.startswith("error: ")][-1]
    assert last.startswith("error: learner rank 0 of 1 died in evaluate_base: "), last
    assert "the run stopped at iteration 0 of 200; continue from iteration 0 (no checkpoint yet) with: " in last
    assert last.endswith(f"with: python -m cluster.launch --resume {tmp_path / 'run'}"), last
    folder = next(line for line in out.splitlines() if line.startswith("local Ray's logs: "))
    subprocess.run(["rm", "-rf", folder.removeprefix("local Ray's logs: ").split("/session_latest")[0]], check=True)


@pytest.mark.ray
def test_the_next_launch_stops_what_a_sigkilled_launcher_left(tmp_path):
    """SIGKILL leaves no chance to clean up, and Ray's dashboard and runtime-env agents outlive their
    raylet; the next launch (even one that fails on its input) stops them and says so."""
    run = launch(tmp_path / "run", "run.iterations=200")
    for line in run.stdout:
        if line.startswith("iteration "):
            break
    descendants = psutil.Process(run.pid).children(recursive=True)
    run.kill()
    run.wait(timeout=60)
    _, alive = psutil.wait_procs(descendants, timeout=10)
    next_run = subprocess.run([sys.executable, "-m", "cluster.launch", "--resume", str(tmp_path / "nothing")],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert next_run.returncode == 2
    _, left = psutil.wait_procs(alive, timeout=10)
    assert not left, [(p.pid, p.name()) for p in left]
    if alive:  # what Ray 2.60 leaves (the agents): the next launch named what it stopped
        assert f"left by launcher {run.pid} of {tmp_path / 'run'}, which was killed" in next_run.stdout, \
            next_run.stdout
        folder = next_run.stdout.split("its logs: ")[1].split(" ")[0]
        subprocess.run(["rm", "-rf", folder], check=True)


# ---- what the run directory and the checkpoint allow, before Ray ----------------------------------------
def launcher(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", IN_RAY_JOB)}
    return subprocess.run([sys.executable, "-m", "cluster.launch", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def test_a_run_directory_that_is_a_file_or_cannot_be_written_is_one_line_before_ray(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    line = one_error_line(launcher("--run-dir", str(tmp_path / "taken" / "run")))
    assert line == (f"error: run directory {tmp_path / 'taken' / 'run'}: {tmp_path / 'taken'} is a file, not a "
                    "folder; choose another --run-dir (or move the file away)")
    locked = tmp_path / "locked"
    locked.mkdir()
    # immutable: nobody, root included, may create a file in it (root passes os.access, so the launcher probes)
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable attribute (chattr +i) to make an unwritable folder with")
    try:
        line = one_error_line(launcher("--run-dir", str(locked / "run")))
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert line == (f"error: run directory {locked / 'run'}: cannot write in {locked} (Operation not permitted); "
                    "choose a writable --run-dir (or run.root)")
    assert not (locked / "run").exists()


def test_resuming_with_another_learner_group_size_must_be_asked_for_and_is_said(tmp_path, small_trainer):
    from cluster import launch

    run_dir = tmp_path / "run"
    small_trainer(run_dir=run_dir).checkpoint()  # rank 0 of a group of 1 records L = 1
    launch.write_config(run_dir, load_config("configs/embedded.yaml", tiny_sets()))
    args = argparse.Namespace(resume=str(run_dir), set=["cluster.learner.count=2"], checkpoint="latest",
                              config=None, run_dir=None)
    plan = launch.resolve(args)
    assert plan.config.cluster.learner.count == 2 and plan.resume == str(run_dir / "checkpoint")
    assert any(note.startswith("cluster.learner.count 1 → 2: the continuation is not the same run") for note in
               plan.notes), plan.notes
    assert not any("learner.count" in n for n in launch.resolve(argparse.Namespace(**{**vars(args), "set": []})).notes)
    edited = (run_dir / "config.yaml").read_text().replace("count: 1\n    collective", "count: 2\n    collective")
    assert edited != (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text(edited)  # changed behind the launcher's back: refused
    line = one_error_line(launcher("--resume", str(run_dir)))
    assert line == ("error: the checkpoint was trained by 1 learner rank(s), the config asks for 2: a change of "
                    "cluster.learner.count must be given with --set cluster.learner.count=2")
