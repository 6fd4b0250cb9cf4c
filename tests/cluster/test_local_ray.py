"""A launcher's clean-up touches only what is its own (the Ray side: test_launch.py, SIGKILL'd launchers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from cluster.runtime import local_ray


def dead_launcher() -> tuple[int, float]:
    """(pid, start time) of a process that has ended: a launcher killed long ago."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(process.pid).create_time()
    process.wait()
    return process.pid, created


@pytest.fixture
def leftovers():
    """`leftover(uid, run_dir)`: a local Ray folder of a dead launcher with one live recorded process."""
    made: list[tuple[Path, subprocess.Popen]] = []

    def leftover(uid: int, run_dir: Path) -> tuple[Path, subprocess.Popen]:
        folder = Path(tempfile.mkdtemp(prefix=Path(local_ray.PREFIX).name, dir=Path(local_ray.PREFIX).parent))
        pid, created = dead_launcher()
        (folder / "launcher.json").write_text(json.dumps({"pid": pid, "created": created, "uid": uid,
                                                          "run_dir": str(run_dir)}))
        process = subprocess.Popen(["sleep", "120"])
        (folder / "processes.json").write_text(json.dumps([[process.pid, psutil.Process(process.pid).create_time()]]))
        made.append((folder, process))
        return folder, process

    yield leftover
    for folder, process in made:
        process.kill()
        process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def test_only_leftovers_of_the_same_user_and_run_root_are_stopped(tmp_path, leftovers):
    mine = leftovers(os.getuid(), tmp_path / "runs" / "a")
    other_user = leftovers(os.getuid() + 1, tmp_path / "runs" / "b")
    other_root = leftovers(os.getuid(), tmp_path / "elsewhere" / "c")
    notes = local_ray.reap_orphans(tmp_path / "runs" / "new")
    assert mine[1].wait(timeout=10) is not None  # stopped
    assert other_user[1].poll() is None and other_root[1].poll() is None  # not ours to judge: untouched
    assert len(notes) == 1
    assert "stopped 1 Ray process(es) (sleep) left by launcher" in notes[0]
    assert f"of {tmp_path / 'runs' / 'a'}, which was killed; its logs: {mine[0]}" in notes[0]


def test_a_process_gone_before_its_signal_is_not_an_error():
    process = subprocess.Popen(["sleep", "120"])
    handle = psutil.Process(process.pid)
    process.kill()
    process.wait()  # reaped: the handle now names a process that no longer exists
    local_ray._signal(handle, "terminate")
    local_ray._signal(handle, "kill")
