"""The control file in a run directory: how a running job is steered from outside (`cluster.control`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CONTROL_FILE = "control.json"


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    explorers: int | None = Field(None, ge=1, description="explorer actors the job should run")
    hold_before: int | None = Field(None, ge=0, description="the job holds before starting this iteration (and "
                                    "any later one) until the field is cleared: the iterations before it are "
                                    "recorded and checkpointed, the actors stay up")


def read_control(run_dir: str | Path) -> Control:
    """The run's control file (an empty Control when there is none). Raises ValueError naming the file and
    the problem when it does not parse."""
    path = Path(run_dir) / CONTROL_FILE
    try:
        return Control.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return Control()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {problems}; write it with python -m cluster.control") from None


def write_control(run_dir: str | Path, **changes: int | None) -> Control:
    """Merge `changes` into the run's control file, atomically (the driver never reads half a file); a
    change to None clears that field."""
    path = Path(run_dir) / CONTROL_FILE
    try:
        current = read_control(run_dir).model_dump(exclude_none=True)
    except ValueError:
        current = {}  # a broken file is replaced
    control = Control(**{k: v for k, v in {**current, **changes}.items() if v is not None})
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(control.model_dump(exclude_none=True)) + "\n")
    os.replace(tmp, path)
    return control


def hold_if_asked(run_dir: str | Path | None, iteration: int, log: Callable[[str], None],
                  poll_s: float = 0.5) -> float:
    """Wait while the control file holds the job before `iteration` (`hold_before` <= iteration); the
    seconds held. Called between iterations, where the run is recorded and checkpointed: an operator can
    replace a node, then release the job (`python -m cluster.control RUN_DIR --release`). A file that
    does not parse holds nothing (ControlTarget reports it)."""
    def held() -> bool:
        try:
            hold = read_control(run_dir).hold_before
        except ValueError:
            return False
        return hold is not None and hold <= iteration

    if run_dir is None or not held():
        return 0.0
    tick = time.monotonic()
    log(f"held before iteration {iteration} by {Path(run_dir) / CONTROL_FILE}; continue with: "
        f"python -m cluster.control {run_dir} --release")
    while held():
        time.sleep(poll_s)
    waited = time.monotonic() - tick
    log(f"released after {waited:.0f} s: iteration {iteration} starts")
    return waited


class ControlTarget:
    """The explorer count the run's control file asks for (`cluster.control`), clipped to the job's room;
    a broken file or a refused count is reported once, and the last good count kept."""

    def __init__(self, run_dir: str | Path | None, count: int, limit: int, log: Callable[[str], None]) -> None:
        self.run_dir, self.target, self.limit, self.log = run_dir, count, limit, log
        self.unreadable: str | None = None
        self.refused: int | None = None

    def read(self) -> int:
        if self.run_dir is None:
            return self.target
        try:
            asked = read_control(self.run_dir).explorers or self.target
        except ValueError as exc:
            if str(exc) != self.unreadable:
                self.log(f"ignoring the control file: {exc}")
            self.unreadable, asked = str(exc), self.target
        if asked > self.limit and asked != self.refused:  # a file written by hand: cluster.control refuses this
            self.log(f"the control file asks for {asked} explorers; the job has room for {self.limit} "
                     f"(cluster.explorers.max): running {self.limit}; resume with --set cluster.explorers.max={asked}")
        self.refused = asked if asked > self.limit else None
        self.target = min(asked, self.limit)
        return self.target
