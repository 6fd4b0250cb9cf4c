"""The evidence suite: the paper's tables on the embedded world, one training run per invocation.

    python -m bench.evidence [--only NAME,...] [--seeds 0,1,2] [--dry-run]   # runs what is missing, then reports
    python -m bench.evidence --report                                        # tables and figures only

Every run trains on `digit_margin` (a reward that keeps rising with quality, unlike `digit_alignment`'s
log p, which saturates at 0) for `ITERATIONS` iterations and writes `bench/results/runs/<run>_seed<s>.json`.
A run whose file exists is not run again, so the suite (hours on two cores) resumes where it stopped;
each run is its own process and should have the machine to itself (its wall clock is reported; the
modeled GPU time is counted work, not timed). `--report` merges every file into
`bench/results/evidence.json`, prints the tables of docs/benchmarks.md and draws the figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from bench.convergence import RUNS

RESULTS = Path("bench/results")
RUN_DIR = RESULTS / "runs"
ITERATIONS = 60
# Runs trained longer than ITERATIONS, evaluated every EVAL_EVERY_LONG: the 60-iteration curves still rise
# linearly, and where the pool pays is read off curves that flatten (docs/benchmarks.md).
LONG = {"diffusionnft_long": 200, "sol_rl_long": 200}
EVAL_EVERY_LONG = 4
COMMON = ["reward.weights={digit_margin: 1.0}"]
# The runs in the order they are made: the headline comparison and Table 1 first, then one seed of each
# ablation, then the second seeds, then the third seeds of what has three.
ART_READINGS = ("sol_rl_art_away_from_target", "sol_rl_art_trust_region")  # learner.art.TRUST_MASKS
PLAN: list[tuple[str, int]] = [
    *[(name, seed) for seed in (0, 1, 2) for name in ("diffusionnft", "sol_rl")],
    *[(name, seed) for seed in (0, 1) for name in ("flow_grpo", "sol_rl_halving")],
    *[(name, seed) for seed in (0, 1) for name in (
        "sol_rl_explore2", "sol_rl_explore4", "sol_rl_explore8", "sol_rl_pool24", "sol_rl_pool48", "sol_rl_pool72",
        "naive_scaling", "naive_quant", "sol_rl_shuffled", *ART_READINGS)],
    *[(name, 2) for name in ("flow_grpo", "sol_rl_halving", "naive_scaling", "naive_quant", "sol_rl_shuffled",
                             *ART_READINGS)],
    # the halving schedule the selection bench ranks best (3 steps for all: 0.75× the exploration)
    *[("sol_rl_halving3", seed) for seed in (0, 1, 2)],
    *[(name, seed) for seed in (0, 1, 2) for name in LONG],
    # adaptive exploration by spread: pools of 48 or 96 by the prompt's proxy spread (≈ 0.75× the exploration)
    *[("sol_rl_spread", seed) for seed in (0, 1, 2)],
]


def run_file(name: str, seed: int) -> Path:
    return RUN_DIR / f"{name}_seed{seed}.json"


def command(name: str, seed: int) -> list[str]:
    sets = [arg for s in COMMON for arg in ("--set", s)]
    length = ["--iterations", str(LONG[name]), "--eval-every", str(EVAL_EVERY_LONG)] if name in LONG else \
        ["--iterations", str(ITERATIONS)]
    return [sys.executable, "-m", "bench.convergence", "--runs", name, "--seeds", str(seed), *length, *sets,
            "--json", str(run_file(name, seed))]


def pending(only: list[str] | None, seeds: list[int] | None) -> list[tuple[str, int]]:
    return [(name, seed) for name, seed in PLAN if (only is None or name in only)
            and (seeds is None or seed in seeds) and not run_file(name, seed).exists()]


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

    report(RUN_DIR, RESULTS)


if __name__ == "__main__":
    main()
