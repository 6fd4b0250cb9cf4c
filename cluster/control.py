"""Steering a running job from outside: the control file in its run directory.

    python -m cluster.control RUN_DIR --explorers 6      # scale the explorers of a running job to 6

The driver reads `RUN_DIR/control.json` once per iteration, at a point where no slot is in flight (sync
mode: before the iteration's slots are sent; async mode: before the next iteration's are). A new explorer
loads its model in the background and takes slots from the first such point after it is ready; a
removed one is stopped there. Results do not change — each slot's seeds are derived from (run seed,
iteration, slot), not from who explores it — and the count is in the metrics (`explorers`). The file
stays: a resumed run starts from the count it asks for. A file that does not parse is reported once
and ignored (the job keeps its count).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CONTROL_FILE = "control.json"


class Control(BaseModel):
    model_config = ConfigDict(extra="forbid")

    explorers: int | None = Field(None, ge=1, description="explorer actors the job should run")


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


def write_control(run_dir: str | Path, **changes: int) -> Control:
    """Merge `changes` into the run's control file, atomically (the driver never reads half a file)."""
    path = Path(run_dir) / CONTROL_FILE
    try:
        current = read_control(run_dir).model_dump(exclude_none=True)
    except ValueError:
        current = {}  # a broken file is replaced
    control = Control(**{**current, **changes})
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(control.model_dump(exclude_none=True)) + "\n")
    os.replace(tmp, path)
    return control


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.control", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the running job's run directory")
    parser.add_argument("--explorers", type=int, required=True, help="explorer actors the job should run")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        print(f"error: {args.run_dir} is not a run directory (it does not exist)", file=sys.stderr)
        return 2
    try:
        control = write_control(args.run_dir, explorers=args.explorers)
    except ValidationError:
        print(f"error: --explorers must be >= 1 (given {args.explorers})", file=sys.stderr)
        return 2
    print(f"{Path(args.run_dir) / CONTROL_FILE}: {control.model_dump(exclude_none=True)} (applied at the job's "
          "next iteration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
