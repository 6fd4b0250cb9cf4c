"""The evidence suite's plan: which runs, with which seeds, at what length, written where — read by the suite
(`bench.evidence`, which makes the missing runs) and by its report (`bench.evidence_report`, which lists
what is still pending)."""

from __future__ import annotations

import sys
from pathlib import Path

RESULTS = Path("bench/results")
RUN_DIR = RESULTS / "runs"
PARTIAL_DIR = RUN_DIR / "partial"  # a run's checkpoints while it trains (`bench.convergence --resume-dir`)
# The previous evidence, kept to say what a change of defaults moved: its folder and what differed. The runs
# in RUN_DIR are made on the sources' defaults (issue 45: LoRA A drawn gaussian, as every official config);
# these were made with peft's default kaiming-uniform A. The other changes issue 45 made to the embedded runs:
# Flow-GRPO samples, trains and evaluates at CFG 4.5 (its config's), where it sampled at CFG 1 — the runs that
# keep CFG 1 are `flow_grpo_cfg1` — and its timestep fraction 0.99 now comes from the objective's defaults.
PREVIOUS_RUN_DIR = RESULTS / "runs_kaiming_init"
PREVIOUS_CHANGE = "LoRA A drawn kaiming-uniform (peft's default) → gaussian N(0, (1/r)²) (the official configs')"
# The previous runs under the names of today's runs that share all their settings but the change: Flow-GRPO at
# CFG 1 was `flow_grpo` then and is `flow_grpo_cfg1` now (so the comparison moves one default at a time).
PREVIOUS_NAMES = {"flow_grpo": "flow_grpo_cfg1", "flow_grpo_ema_every1": "flow_grpo_cfg1_ema_every1"}
ITERATIONS = 60
# Runs trained longer than ITERATIONS, evaluated every EVAL_EVERY_LONG: the 60-iteration curves still rise
# linearly, and where the pool pays is read off curves that flatten (docs/benchmarks.md).
LONG = {"diffusionnft_long": 200, "sol_rl_long": 200}
EVAL_EVERY_LONG = 4
COMMON = ["reward.weights={digit_margin: 1.0}"]
# The runs in the order they are made: the headline comparison and Table 1 first, then one seed of each
# ablation, then the second seeds, then the third seeds of what has three; the long pair last.
ART_READINGS = ("sol_rl_art_away_from_target", "sol_rl_art_trust_region")  # learner.art.TRUST_MASKS
PLAN: list[tuple[str, int]] = [
    *[(name, seed) for seed in (0, 1, 2) for name in ("diffusionnft", "sol_rl")],
    *[(name, seed) for seed in (0, 1) for name in ("flow_grpo", "sol_rl_halving")],
    *[(name, seed) for seed in (0, 1) for name in (
        "sol_rl_explore2", "sol_rl_explore4", "sol_rl_explore8", "sol_rl_pool24", "sol_rl_pool48", "sol_rl_pool72",
        "naive_scaling", "naive_quant", "sol_rl_shuffled", *ART_READINGS)],
    *[(name, 2) for name in ("flow_grpo", "sol_rl_halving", "naive_scaling", "naive_quant", "sol_rl_shuffled",
                             *ART_READINGS)],
    # Flow-GRPO read against its own choices: sampling at CFG 1 (the NFT family's), and EMA every step
    *[("flow_grpo_cfg1", seed) for seed in (0, 1)],
    ("flow_grpo_ema_every1", 0),
    # the halving schedule the selection bench ranks best (3 steps for all: 0.75× the exploration)
    *[("sol_rl_halving3", seed) for seed in (0, 1, 2)],
    # adaptive exploration by spread: pools of 48 or 96 by the prompt's proxy spread (≈ 0.75× the exploration)
    *[("sol_rl_spread", seed) for seed in (0, 1, 2)],
    # DiffusionART without the pool: does the pool pay under ART (against sol_rl_art_trust_region)?
    *[("diffusionnft_art", seed) for seed in (0, 1, 2)],
    # the long pair last: ~5 h of the suite's ~8 on two cores, so every 60-iteration table is whole before it
    *[(name, seed) for seed in (0, 1, 2) for name in LONG],
]


def run_file(name: str, seed: int) -> Path:
    return RUN_DIR / f"{name}_seed{seed}.json"


def command(name: str, seed: int) -> list[str]:
    sets = [arg for s in COMMON for arg in ("--set", s)]
    length = ["--iterations", str(LONG[name]), "--eval-every", str(EVAL_EVERY_LONG)] if name in LONG else \
        ["--iterations", str(ITERATIONS)]
    return [sys.executable, "-m", "bench.convergence", "--runs", name, "--seeds", str(seed), *length, *sets,
            "--json", str(run_file(name, seed)), "--resume-dir", str(PARTIAL_DIR)]


def pending(only: list[str] | None, seeds: list[int] | None) -> list[tuple[str, int]]:
    return [(name, seed) for name, seed in PLAN if (only is None or name in only)
            and (seeds is None or seed in seeds) and not run_file(name, seed).exists()]
