"""The launcher's own local Ray: a private folder, its processes on record, nothing left behind.

`ray.init()` without an address starts a head (GCS, raylet, dashboard, agents) that shares the
launcher's fate only in part: killed with SIGKILL, the launcher leaves the dashboard agent (holding
port 52365) and the runtime-env agent running — measured on Ray 2.60, still alive a minute later.
So each local Ray lives in `/tmp/solrl-ray-*` with `launcher.json` (who started it: pid and start time,
user, run directory) and `processes.json` (its processes), and every launch first stops the processes
of launchers that are gone — only those of the same user whose run directory lies in the same run root
(the same parent folder), so one operator's launch never touches another's leftovers. A clean run
removes its folder; a failed one keeps it for its logs.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

PREFIX = "/tmp/solrl-ray-"  # short: Ray's socket paths must fit in 107 bytes


def _identity(process: psutil.Process) -> list[float]:
    """(pid, start time): a pid alone may have been reused by an unrelated process."""
    return [process.pid, process.create_time()]


def _alive(pid: int, created: float) -> psutil.Process | None:
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - created) < 1e-3 and process.status() != psutil.STATUS_ZOMBIE:
            return process
    except psutil.Error:
        pass
    return None


@dataclass
class LocalRay:
    folder: Path

    @classmethod
    def start(cls, run_dir: Path, **init_kwargs) -> LocalRay:
        import ray

        folder = Path(tempfile.mkdtemp(prefix=Path(PREFIX).name, dir=Path(PREFIX).parent))
        pid, created = _identity(psutil.Process())
        (folder / "launcher.json").write_text(json.dumps(
            {"pid": pid, "created": created, "uid": os.getuid(), "run_dir": str(run_dir)}))
        ray.init(_temp_dir=str(folder), **init_kwargs)
        local = cls(folder)
        local.record()
        return local

    def record(self) -> None:
        """Put the launcher's descendants (Ray's head processes, actors) on record."""
        processes = [_identity(p) for p in psutil.Process().children(recursive=True)]
        tmp = self.folder / "processes.json.tmp"
        tmp.write_text(json.dumps(processes))
        tmp.replace(self.folder / "processes.json")

    def stop(self, *, remove: bool) -> None:
        """Shut Ray down, stop any recorded process that outlived it, and remove the folder if asked."""
        import ray

        ray.shutdown()
        _stop_recorded(self.folder)
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)


def _signal(process: psutil.Process, how: str) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):  # it ended on its own since the check: nothing to do
        getattr(process, how)()


def _stop_recorded(folder: Path) -> list[str]:
    """Stop the folder's recorded processes that are still alive; their names."""
    try:
        recorded = json.loads((folder / "processes.json").read_text())
    except (OSError, ValueError):
        return []
    survivors = [p for p in (_alive(pid, created) for pid, created in recorded) if p is not None]
    names = []
    for process in survivors:
        try:
            names.append(process.name())
        except psutil.Error:
            names.append(str(process.pid))
        _signal(process, "terminate")
    _, still = psutil.wait_procs(survivors, timeout=5)
    for process in still:
        _signal(process, "kill")
    return names


def _launcher(folder: Path) -> dict | None:
    """launcher.json of a local Ray folder (None: unreadable, or written by an older launcher, which
    recorded no owner and so is not ours to judge)."""
    try:
        launcher = json.loads((folder / "launcher.json").read_text())
    except (OSError, ValueError):
        return None
    return launcher if isinstance(launcher, dict) and {"pid", "created", "uid", "run_dir"} <= launcher.keys() \
        else None


def reap_orphans(run_dir: Path) -> list[str]:
    """Stop the processes of local Rays whose launcher is gone (killed with SIGKILL, or a crashed
    machine session) — launchers of this user whose run directory was `run_dir` or beside it (the same
    run root); their folders stay for their logs. One line per folder, naming what was stopped."""
    notes, root = [], Path(run_dir).parent
    for name in sorted(glob.glob(PREFIX + "*")):
        folder = Path(name)
        launcher = _launcher(folder)
        if launcher is None or launcher["uid"] != os.getuid() or Path(launcher["run_dir"]).parent != root:
            continue
        pid = launcher["pid"]
        if _alive(pid, launcher["created"]) is not None or pid == os.getpid():
            continue
        stopped = _stop_recorded(folder)
        (folder / "processes.json").unlink(missing_ok=True)
        if stopped:
            notes.append(f"stopped {len(stopped)} Ray process(es) ({', '.join(sorted(set(stopped)))}) left by "
                         f"launcher {pid} of {launcher['run_dir']}, which was killed; its logs: {folder} "
                         "(remove it when done)")
    return notes
