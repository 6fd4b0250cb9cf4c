"""Steering a running job from outside: the control file in its run directory.

    python -m cluster.control RUN_DIR --explorers 6      # scale the explorers of a running job to 6
    python -m cluster.control RUN_DIR --hold-before 40   # hold the job before iteration 40 (maintenance)
    python -m cluster.control RUN_DIR --release          # and let it go on

The count is bounded by `cluster.explorers.max` (default: `count`), the room the job was started with: a
local Ray reserves resources for that many, and asking for more is refused here, naming the setting (a
resumed run can raise it: `--resume RUN_DIR --set cluster.explorers.max=N`). A directory that is not a
run (no config.yaml) or whose run has finished is refused in one line; a run that is not running now
(no launcher holds its lock, `cluster.runtime.run_lock`) takes the count when it is resumed.

The driver reads `RUN_DIR/control.json` once per iteration, at a point where no slot is in flight (sync
mode: before the iteration's slots are sent; async mode: before the next iteration's are). A new explorer
loads its model in the background and takes slots from the first such point after it is ready; a
removed one is stopped there. Results do not change — each slot's seeds are derived from (run seed,
iteration, slot), not from who explores it — and the count is in the metrics (`explorers`). The file
stays: a resumed run starts from the count it asks for. A file that does not parse is reported once
and ignored (the job keeps its count).

A hold stops the job between iterations with its actors up: every iteration before `--hold-before N`
is recorded and checkpointed, then the driver waits (its log says so) until `--release`. Meanwhile a
node can be drained or replaced: an explorer lost with it restarts elsewhere, or leaves the pool (see
docs/scaling.md). A learner rank's node must stay: its loss ends the job (resumable) as at any time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cluster.runtime.control_file import CONTROL_FILE, write_control
from cluster.runtime.run_lock import running_holder


def refusal(run_dir: Path, explorers: int | None) -> str | None:
    """Why the control file of `run_dir` cannot be written, with `explorers` if given (None: it can)."""
    from cluster.config.loading import ConfigError, load_config

    if not run_dir.is_dir():
        return f"{run_dir} is not a run directory (it does not exist)"
    if not (run_dir / "config.yaml").is_file():
        return f"{run_dir} is not a run directory of this tool (no config.yaml)"
    if explorers is None:
        return None
    if explorers < 1:
        return f"--explorers must be >= 1 (given {explorers})"
    try:
        limit = load_config(run_dir / "config.yaml").cluster.explorers.limit
    except ConfigError as exc:
        return str(exc)
    if explorers > limit:
        return (f"{run_dir}: the job has room for at most {limit} explorer(s) (cluster.explorers.max, default "
                f"cluster.explorers.count); asked for {explorers}. Resume it with --set cluster.explorers.max="
                f"{explorers} (a local Ray then reserves that room) to scale that far")
    if running_holder(run_dir) is None and (run_dir / "summary.json").is_file():
        return (f"{run_dir}: the run has finished (summary.json) and no job runs on it; to train further: "
                f"python -m cluster.launch --resume {run_dir} --set run.iterations=N --set "
                f"cluster.explorers.count={explorers}")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.control", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the running job's run directory")
    parser.add_argument("--explorers", type=int, help="explorer actors the job should run")
    hold = parser.add_mutually_exclusive_group()
    hold.add_argument("--hold-before", type=int, metavar="N", help="hold the job before iteration N (0-based, as "
                      "in metrics.jsonl) with its actors up, until --release")
    hold.add_argument("--release", action="store_true", help="let a held job go on")
    args = parser.parse_args(argv)
    if args.explorers is None and args.hold_before is None and not args.release:
        parser.error("say what to change: --explorers N, --hold-before N or --release")
    if args.hold_before is not None and args.hold_before < 0:
        parser.error(f"--hold-before must be >= 0 (given {args.hold_before})")
    problem = refusal(args.run_dir, args.explorers)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    changes: dict[str, int | None] = {} if args.explorers is None else {"explorers": args.explorers}
    if args.hold_before is not None or args.release:
        changes["hold_before"] = args.hold_before  # None: released
    control = write_control(args.run_dir, **changes)
    holder = running_holder(args.run_dir)
    when = f"applied at the job's next iteration (launcher pid {holder.get('pid')} on {holder.get('host')})" \
        if holder is not None else f"no job runs on it now: applied when it is resumed (--resume {args.run_dir})"
    print(f"{args.run_dir / CONTROL_FILE}: {control.model_dump(exclude_none=True)} ({when})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
