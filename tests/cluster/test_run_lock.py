"""One job per run directory: the lock, between real processes (the launcher's side: test_operator_session)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from cluster.runtime import run_lock

HOLD = ("import sys, time; from pathlib import Path; from cluster.runtime import run_lock; "
        "lock = run_lock.acquire(Path(sys.argv[1]), sys.argv[2]); print('held', flush=True); time.sleep(120)")


def hold(run_dir, submission: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), submission], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_dies_with_its_holder(tmp_path):
    run = tmp_path / "run"
    first = hold(run, "solrl-exp-1")
    try:
        with pytest.raises(run_lock.RunLocked) as refused:
            run_lock.acquire(run, "solrl-exp-2")
        message = str(refused.value)
        assert "\n" not in message
        assert f"in use by a running job (pid {first.pid} on {socket.gethostname()}" in message
        assert "Ray submission solrl-exp-1" in message and "one job per run directory" in message
        assert run_lock.running_holder(run)["pid"] == first.pid
        with pytest.raises(run_lock.RunLocked) as asked:  # the launcher's question before its preflight
            run_lock.refuse_if_held(run)
        assert str(asked.value) == message
    finally:
        os.kill(first.pid, signal.SIGKILL)  # no chance to clean up: the kernel releases the lock
        first.wait()
    assert run_lock.running_holder(run) is None
    run_lock.refuse_if_held(run)  # free: no error
    run_lock.refuse_if_held(tmp_path / "never made")
    assert not (tmp_path / "never made").exists()  # asking writes nothing
    lock = run_lock.acquire(run, None)  # stale lock file, free lock: taken, and the file names the new holder
    assert json.loads((run / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert run_lock.running_holder(run) is None


def test_a_released_lock_can_be_taken_again_in_the_same_process(tmp_path):
    lock = run_lock.acquire(tmp_path / "a", "x")
    lock.release()
    lock.release()  # idempotent
    again = run_lock.acquire(tmp_path / "a", "y")
    assert run_lock.read_holder(tmp_path / "a")["submission_id"] == "y"
    again.release()
