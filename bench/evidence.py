"""The evidence suite: the paper's tables on the embedded world, one training run per invocation.

    python -m bench.evidence [--only NAME,...] [--seeds 0,1,2] [--dry-run]   # runs what is missing, then reports
    python -m bench.evidence --report                                        # tables and figures only

Every run trains on `digit_margin` (a reward that keeps rising with quality, unlike `digit_alignment`'s
log p, which saturates at 0) for `ITERATIONS` iterations and writes `bench/results/runs/<run>_seed<s>.json`.
A run whose file exists is not run again, so the suite (hours on two cores) resumes where it stopped, and a
run killed mid-way continues from its last evaluation (`bench/results/runs/partial/`, `bench.convergence
--resume-dir`); each run is its own process and should have the machine to itself (its wall clock is reported; the
modeled GPU time is counted work, not timed). `--report` merges every file into
`bench/results/evidence.json`, prints the tables of docs/benchmarks.md and draws the figures; the runs of the
previous evidence (`PREVIOUS_RUN_DIR`, made before a change of defaults) give a section on what moved.
"""

from __future__ import annotations

import argparse
import subprocess

from bench.convergence import RUNS
from bench.evidence_plan import COMMON, ITERATIONS, PLAN, PREVIOUS_RUN_DIR, RESULTS, RUN_DIR, command, pending, run_file

__all__ = ["COMMON", "ITERATIONS", "PLAN", "RESULTS", "RUN_DIR", "command", "pending", "run_file"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", type=lambda s: s.split(","), default=None, help=f"runs of: {', '.join(RUNS)}")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the commands of the missing runs")
    parser.add_argument("--report", action="store_true", help="no training: tables and figures from the files")
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(name for name, _ in PLAN))
    unknown = [n for n in args.only or [] if n not in names]
    if unknown:
        parser.error(f"--only: {', '.join(unknown)} not in the suite; its runs: {', '.join(names)}")
    if not args.report:
        todo = pending(args.only, args.seeds)
        print(f"{len(todo)} run(s) missing", flush=True)
        for name, seed in todo:
            cmd = command(name, seed)
            print(" ".join(cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, check=True)  # a failed run stops the suite; finished files stay
        if args.dry_run:
            return
    from bench.evidence_report import report  # matplotlib and the tables: only when reporting

    report(RUN_DIR, RESULTS, previous_dir=PREVIOUS_RUN_DIR)


if __name__ == "__main__":
    main()
