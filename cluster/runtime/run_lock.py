"""One job per run directory: an exclusive lock held by the launcher for the job's whole life.

Two launchers on one run directory (a second `--resume R` while R trains) would both train it and
interleave `metrics.jsonl`. So the launcher (the job's driver, also under `ray job submit`) takes
`RUN_DIR/job.lock` with `flock(LOCK_EX | LOCK_NB)` once every input has been checked, before Ray starts,
and keeps the open file until its process ends. The kernel releases the lock on any exit — a clean
return, an exception, SIGKILL — so a lock is never stale after its holder's death, and nothing has to
be cleaned up. The file's text names the holder (host, pid, user, submission id, since when), so the
refused launcher can say who holds it; the text is rewritten by each holder and never trusted for the
decision, only the lock is.

Where it holds: a local disk; NFS v3 (with lockd) and v4, on which Linux emulates flock with POSIX
locks visible to every client (a crashed client host's lock lasts until the server's lease expires,
90 s by default on v4); CephFS and GPFS. Lustre only when mounted with `-o flock` (without it, flock
fails with ENOSYS/EOPNOTSUPP). A file system that supports no locking is refused with one line: run
directories there cannot be protected, so say so rather than silently allow two jobs.
"""

from __future__ import annotations

import errno
import fcntl
import getpass
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

LOCK_FILE = "job.lock"


class RunLocked(RuntimeError):
    """The run directory is held by another live launcher (the message names it)."""


@dataclass
class RunLock:
    """The held lock of one run directory; released by `release()` or by the process ending."""

    path: Path
    file: IO[str]

    def release(self) -> None:
        if not self.file.closed:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it wrote no details yet)"
    parts = [f"pid {holder.get('pid')} on {holder.get('host')}"]
    if holder.get("user"):
        parts.append(f"user {holder['user']}")
    if holder.get("submission_id"):
        parts.append(f"Ray submission {holder['submission_id']}")
    if holder.get("since"):
        parts.append(f"since {holder['since']}")
    return ", ".join(parts)


def read_holder(run_dir: Path) -> dict[str, Any]:
    """What the lock file says of its last holder ({} when absent or unreadable)."""
    try:
        holder = json.loads((Path(run_dir) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _open(run_dir: Path) -> IO[str]:
    return open(os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644), "r+")


def _try_lock(file: IO[str], run_dir: Path) -> bool:
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            file.close()
            raise RunLocked(f"{run_dir}: its file system supports no file locks ({exc.strerror}), so two jobs on "
                            "it could not be kept apart; put the run directory on a local disk, NFS, CephFS, or "
                            "Lustre mounted with -o flock") from None
        raise


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # a container user with no passwd entry
        return None


def _in_use(run_dir: Path, holder: dict[str, Any]) -> RunLocked:
    return RunLocked(f"{run_dir} is in use by a running job ({_describe(holder)}): one job per run directory; wait "
                     "for it, stop it (Ctrl-C, or `ray job stop` for a submission), or choose another --run-dir")


def refuse_if_held(run_dir: Path) -> None:
    """Raise `RunLocked` if a running job holds the run directory, without taking the lock or writing anything:
    the launcher asks before its preflight, so a second launcher is refused at once (it takes the lock itself,
    race-free, after the preflight)."""
    if running_holder(run_dir) is not None:
        raise _in_use(run_dir, read_holder(run_dir))


def acquire(run_dir: Path, submission_id: str | None = None) -> RunLock:
    """Take the run directory's lock (creating the directory) or raise `RunLocked` naming the holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    file = _open(run_dir)
    if not _try_lock(file, run_dir):
        file.close()
        raise _in_use(run_dir, read_holder(run_dir))
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "user": _user(),
              "submission_id": submission_id, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    file.seek(0)
    file.truncate()
    file.write(json.dumps(holder) + "\n")
    file.flush()
    return RunLock(run_dir / LOCK_FILE, file)


def running_holder(run_dir: Path) -> dict[str, Any] | None:
    """The live holder of the run directory's lock, or None when no job holds it (tried without waiting,
    and released at once: it never blocks a launcher for longer than the call)."""
    if not (Path(run_dir) / LOCK_FILE).is_file():
        return None
    with open(Path(run_dir) / LOCK_FILE) as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_holder(run_dir) or {"pid": None, "host": None}
        except OSError:
            return None  # no locks on this file system: nobody can be holding one
        fcntl.flock(file, fcntl.LOCK_UN)
    return None
