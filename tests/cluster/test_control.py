"""The control file that steers a running job (its Ray side: tests/cluster/test_cluster.py, elastic explorers;
through the launcher: tests/cluster/test_operator_session.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from cluster import control
from cluster.config.loading import load_config
from cluster.runtime import control_file, run_lock


def make_run(folder, *sets: str):
    """A run directory as the launcher leaves it before training: its resolved config.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    config = load_config("configs/embedded.yaml", list(sets))
    (folder / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return folder


def test_a_bad_control_file_is_named_and_a_bad_count_refused(tmp_path, capsys):
    run = make_run(tmp_path / "run", "cluster.explorers.max=3")
    (run / control_file.CONTROL_FILE).write_text('{"explorers": 0}')
    with pytest.raises(ValueError, match=r"control\.json: explorers: Input should be greater than or equal to 1"):
        control_file.read_control(run)
    assert control.main([str(run), "--explorers", "0"]) == 2
    assert "--explorers must be >= 1" in capsys.readouterr().err
    assert control.main([str(run), "--explorers", "3"]) == 0  # a broken file is replaced
    assert control_file.read_control(run).explorers == 3


def test_control_refuses_what_the_job_could_not_do_in_one_line(tmp_path, capsys):
    """Not a run, a count above the room the job was started with, a finished run: each refused, the file
    untouched; a run no job holds takes the count when it is resumed."""
    assert control.main([str(tmp_path / "missing"), "--explorers", "2"]) == 2
    assert "is not a run directory (it does not exist)" in capsys.readouterr().err
    assert control.main([str(tmp_path), "--explorers", "2"]) == 2
    assert "not a run directory of this tool (no config.yaml)" in capsys.readouterr().err

    run = make_run(tmp_path / "run")  # the default: room for cluster.explorers.count = 1
    assert control.main([str(run), "--explorers", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "room for at most 1 explorer(s) (cluster.explorers.max" in err
    assert "--set cluster.explorers.max=3" in err
    assert not (run / control_file.CONTROL_FILE).exists()

    roomy = make_run(tmp_path / "roomy", "cluster.explorers.max=3")
    assert control.main([str(roomy), "--explorers", "3"]) == 0
    assert "no job runs on it now: applied when it is resumed" in capsys.readouterr().out

    (roomy / "summary.json").write_text("{}")
    assert control.main([str(roomy), "--explorers", "2"]) == 2
    assert "the run has finished (summary.json) and no job runs on it" in capsys.readouterr().err
    assert control_file.read_control(roomy).explorers == 3


def test_control_names_the_launcher_holding_a_running_job(tmp_path, capsys):
    """A job runs while some process holds the run directory's lock (`cluster.runtime.run_lock`): here a real
    second process, as a launcher would be."""
    run = make_run(tmp_path / "run", "cluster.explorers.max=2")
    (run / "summary.json").write_text("{}")  # a finished run being extended: running, so steerable
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from cluster.runtime import run_lock; "
                               "lock = run_lock.acquire(Path(sys.argv[1]), 'sub-1'); "
                               "print('held', flush=True); time.sleep(60)", str(run)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert control.main([str(run), "--explorers", "2"]) == 0
        assert f"applied at the job's next iteration (launcher pid {holder.pid} on " in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
    deadline = time.time() + 30
    while run_lock.running_holder(run) is not None:  # released with the holder's death
        assert time.time() < deadline
        time.sleep(0.1)


def test_a_hold_waits_between_iterations_until_released_and_keeps_the_explorer_count(tmp_path, capsys):
    """`--hold-before N` holds iteration N and every later one (not an earlier one); `--release` clears only
    the hold; the driver's wait logs where it holds and how to continue."""
    import threading

    run = make_run(tmp_path / "run", "cluster.explorers.max=2")
    assert control.main([str(run), "--explorers", "2"]) == 0
    assert control.main([str(run), "--hold-before", "3"]) == 0
    assert control_file.read_control(run) == control_file.Control(explorers=2, hold_before=3)
    logged: list[str] = []
    assert control_file.hold_if_asked(run, 2, logged.append) == 0.0 and logged == []

    held = threading.Thread(target=lambda: logged.append(f"waited {control_file.hold_if_asked(run, 4, logged.append)}"))
    held.start()
    deadline = time.time() + 30
    while not logged and time.time() < deadline:
        time.sleep(0.05)
    assert logged == [f"held before iteration 4 by {run / control_file.CONTROL_FILE}; continue with: "
                      f"python -m cluster.control {run} --release"]
    assert held.is_alive()
    assert control.main([str(run), "--release"]) == 0
    held.join(timeout=30)
    assert not held.is_alive()
    assert logged[1].startswith("released after ") and logged[1].endswith(" s: iteration 4 starts")
    assert float(logged[2].removeprefix("waited ")) > 0
    assert control_file.read_control(run) == control_file.Control(explorers=2)
    with pytest.raises(SystemExit):
        control.main([str(run)])
    assert "say what to change: --explorers N, --hold-before N or --release" in capsys.readouterr().err
