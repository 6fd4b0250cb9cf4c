"""Convergence of the paper's four algorithms from the same base, prompts and seeds.

    python -m bench.convergence [--config FILE] [--algorithms diffusionnft,naive_scaling,naive_quant,sol_rl]
        [--objective nft|art] [--iterations N] [--seeds 0,1] [--eval-every 2] [--control] [--art]
        [--set key=value ...] --json FILE [--png FILE]
    python -m bench.convergence --merge A.json B.json ... --json FILE [--png FILE]   # one file per seed → one
    ... [--costs FILE]   # price the work at measured per-phase costs (bench.gpu_check's costs_<model>.json)

Every run starts from the same base model; run seed s fixes prompts, seeds and noise, so algorithms
differ only in how they explore and what they train on. Every `--eval-every` iterations the trained
policy is evaluated on fixed held-out prompts and seeds (full precision, the sampler's steps).

Three clocks: iterations; measured wall time (this CPU); and **modeled GPU time** — a cost model,
not a measurement: the run's counted work (`learner.iteration_record.Work`) priced at the paper's
SD3.5-L Table 5 rates (`bench.prices`: sample-steps by precision and kind, training passes, and each
image decoded and scored by the reward at d, which Table 5 brackets in [0, 0.117] GPU-s: the midpoint by
default, `PRICES_LOW_D` and `PRICES_HIGH_D` its ends), or at measured costs (`--costs`). Each point keeps
its raw cumulative counters, so the model is applied (and can be re-applied) in the report; points of run
files from before `scored_images` was counted get it from their step counters and the run's settings
(`backfill_scored_images`), the count the counter gives.

Speedup of an algorithm = time for diffusionnft to first reach its own final held-out reward ÷ time for
the algorithm to first reach it (per run seed; mean and spread over seeds; crossings interpolated between
evaluations). A profile repeats this for the baseline's reward at ¼, ½ and ¾ of its run, because the
answer depends on where the target sits on the curve. `--control` adds sol_rl with
each prompt's rewards shuffled among its samples (must stay flat); `--art` adds sol_rl with DiffusionART
(both readings of its trust mask).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.plan import CONFIGS, load_costs
from bench.prices import (
    COUNTERS,
    PRICES,
    PRICES_HIGH_D,  # noqa: F401  (the bracket's ends, for a report's sensitivity)
    PRICES_LOW_D,  # noqa: F401
    Costs,
    counter_prices,
    measured_note,
    prices_at,  # noqa: F401
)
from cluster.config.loading import load_config
from cluster.config.schema import SolRLConfig
from diffusion.progress import Progress
from learner.algorithms import ALGORITHMS
from learner.checkpoint import CHECKPOINT_DIR, has_checkpoint
from learner.config import TrainerConfig
from learner.rollouts import exploration_sampling, regeneration_sampling
from learner.trainer import Trainer

POINTS_FILE = "points.json"  # a resumable run's points so far (`run_one`)

# The cost model is `bench.prices`: every counter of `learner.iteration_record.Work` at the paper's
# SD3.5-L Table 5 rates (PRICES, at the default decode + reward price d; PRICES_LOW_D and PRICES_HIGH_D at
# the ends of the range Table 5 allows), or at measured costs (`prices_from`).


def prices_from(costs: Costs) -> dict[str, float]:
    """GPU-seconds per counter from measured per-phase costs (`--costs`, e.g. `bench.gpu_check`'s): a pool's
    full-precision step is priced as a regeneration step, a scored image at the file's d (0 without one)."""
    return counter_prices(costs)


def images_per_step(config: TrainerConfig) -> dict[str, tuple[int, int]]:
    """Per step counter, (images, sample-steps) of one unit of the work it counts in a run of `config`, each
    image decoded and scored once (`learner.slot_rollout.SlotRollout.rollout`): a kept sample (regeneration,
    K-in-K) is one image per S_r steps (2·S_r under CFG: `Sampling.sample_steps`); Sol-RL's explore pass
    N + M images (M: successive halving's survivors, 0 without) per `Sampling.pool_steps(N)` steps (N·S_x,
    or N·f + M·(S_x − f)); a pool trained on (naive scaling, naive quantization) one image per sampler step
    count. Pool sizes must be fixed: a schedule that varies them per slot has only its counter."""
    if config.explore.schedule not in ("fixed", "halving"):
        raise ValueError(f"explore.schedule {config.explore.schedule}: pool sizes vary per slot, so scored "
                         "images cannot be told from step counts; such a run must record scored_images")
    algorithm, n = ALGORITHMS[config.learner.algorithm], config.prompts.candidates
    regen, explore = regeneration_sampling(config), exploration_sampling(config)
    if algorithm.explore_steps == "explore":
        pool = (n + (explore.halving[1] if explore.halving is not None else 0), explore.pool_steps(n))
    else:
        pool = (1, regen.sample_steps(1))
    return {"fp_sample_steps": (1, regen.sample_steps(1)), "fp_pool_sample_steps": pool, "lp_sample_steps": pool}


def backfill_scored_images(point: dict[str, Any], config: TrainerConfig) -> float:
    """The `scored_images` of a point recorded without it, from its step counters and the run's `config`
    (`images_per_step`): exactly what the counter gives, for every run of fixed pool sizes."""
    return sum(point[counter] * images / steps for counter, (images, steps) in images_per_step(config).items())


_RUN_CONFIGS: dict[str, SolRLConfig] = {}
# Runs recorded (in older result files) under a name RUNS no longer has: their settings, for the backfill.
RETIRED_RUNS: dict[str, list[str]] = {
    "sol_rl_art": ["learner.algorithm=sol_rl", "learner.objective=art", "learner.decay.type=0"],
}


def run_config(name: str) -> SolRLConfig:
    """The settings a named run (`RUNS`, or `RETIRED_RUNS`) trains with: the default config and its own."""
    settings = RUNS.get(name, RETIRED_RUNS.get(name))
    if settings is None:
        raise ValueError(f"run {name!r}: its points have no scored_images counter (a run file from before it was "
                         "counted) and it is not a named run (bench.convergence.RUNS or RETIRED_RUNS), so the "
                         "settings to count its scored images from are unknown: add it to RETIRED_RUNS")
    if name not in _RUN_CONFIGS:
        _RUN_CONFIGS[name] = load_config(CONFIGS / "embedded.yaml", settings)
    return _RUN_CONFIGS[name]


def run_one(config: SolRLConfig, log, resume: Path | None = None) -> list[dict[str, Any]]:
    """Train one run; a point per evaluation (the trainer's own schedule: `eval.every` and the last
    iteration) with the held-out reward and cumulative raw counters.

    `resume`: a folder where the run checkpoints at every evaluation (the trainer's checkpoint, then
    `points.json`, the points so far): a run stopped there continues from its last checkpoint, with the
    points it would have made without stopping — bitwise on CPU (`Trainer.resume`), the wall-clock seconds
    apart. A long run thus survives a killed process."""
    if resume is not None:  # a checkpoint at every point, so a resumed run's counters are the last point's
        config = config.model_copy(update={"run": config.run.model_copy(
            update={"checkpoint_every": config.eval.every})})
    trainer = Trainer(config, run_dir=resume)
    saved = resume / POINTS_FILE if resume is not None else None
    if resume is not None:
        resume.mkdir(parents=True, exist_ok=True)
    if resume is not None and has_checkpoint(resume / CHECKPOINT_DIR) and saved.exists():
        trainer.resume()
        trainer.publish()
        # points.json is written before the checkpoint: a stop between the two leaves a point too many
        points = [p for p in json.loads(saved.read_text()) if p["iteration"] <= trainer.iteration]
        totals = {key: points[-1][key] for key in ("wall_s", "rollout_s", "train_s", *COUNTERS)}
        log(f"    resumed at iteration {trainer.iteration} from {resume}", flush=True)
    else:
        totals = dict.fromkeys(("wall_s", "rollout_s", "train_s", *COUNTERS), 0.0)
        points = [{"iteration": 0, **totals, **trainer.evaluate()}]
    progress = Progress("    iteration", config.run.iterations, done=trainer.iteration)
    objective: dict[str, list[float]] = {}  # the update's own numbers since the previous point
    for i in range(trainer.iteration, config.run.iterations):
        result = trainer.train_iteration(i)
        trainer.publish()
        m = {**result.metrics(), **trainer.finish_iteration().evaluation}  # work per iteration; eval when due
        totals["wall_s"] += m["iteration_s"]
        for key in ("rollout_s", "train_s", *COUNTERS):
            totals[key] += m[key]
        for key, value in result.losses.items():
            objective.setdefault(key, []).append(float(value))
        if "eval_reward" not in m:
            continue
        point = {"iteration": i + 1, **totals, "train_reward": m["reward_mean"],
                 **{k: v for k, v in m.items() if k.startswith("eval_")},
                 "objective": {k: float(np.nanmean(v)) if np.isfinite(v).any() else math.nan
                               for k, v in objective.items()}}
        objective = {}
        if "rank_spearman" in m:
            point["rank_spearman"] = m["rank_spearman"]
        points.append(point)
        if saved is not None:
            tmp = saved.with_suffix(".tmp")
            tmp.write_text(json.dumps(points))
            tmp.replace(saved)
        trainer.checkpoint()
        log(f"{progress.line(i + 1)}  held-out reward {point['eval_reward']:7.3f}  "
            f"acc {point.get('eval_accuracy', float('nan')):.3f}  wall {totals['wall_s']:6.1f}s  "
            f"(rollout {totals['rollout_s']:6.1f}s, train {totals['train_s']:6.1f}s)", flush=True)
    return points


def modeled_cost(point: dict[str, Any], prices: dict[str, float] = PRICES) -> float:
    """Σ counter × its price (`PRICES`): modeled GPU-seconds, the same on any machine and under any load."""
    missing = [key for key in prices if key not in point]
    if missing:
        raise KeyError(f"the point has no counter {', '.join(missing)}: add_modeled_cost fills scored_images "
                       "for run files recorded before it was counted")
    return sum(point[key] * price for key, price in prices.items())


def add_modeled_cost(runs: dict[str, dict[int, list[dict[str, Any]]]], prices: dict[str, float] = PRICES) -> None:
    """`modeled_s` of every point; a point without `scored_images` (a run file from before it was counted)
    gets it from its step counters and its named run's settings first (`backfill_scored_images`)."""
    for name, by_seed in runs.items():
        for points in by_seed.values():
            for p in points:
                if "scored_images" not in p:
                    p["scored_images"] = backfill_scored_images(p, run_config(name))
                p["modeled_s"] = modeled_cost(p, prices)


def first_reach(points: list[dict[str, Any]], target: float, clock: str) -> float:
    """When the held-out reward first reaches `target`, on `clock`, interpolated linearly between the
    evaluation before the crossing and the one at it (evaluations are every few iterations; taking the
    later one would round every run's time up to the evaluation grid). inf if never reached."""
    previous = None
    for p in points:
        if p["eval_reward"] >= target:
            if previous is None:
                return p[clock]
            fraction = (target - previous["eval_reward"]) / (p["eval_reward"] - previous["eval_reward"])
            return previous[clock] + fraction * (p[clock] - previous[clock])
        previous = p
    return math.inf


def baseline_target(points: list[dict[str, Any]], fraction: float = 1.0) -> float:
    """The baseline's held-out reward at the first evaluation at or past `fraction` of its run."""
    last = points[-1]["iteration"]
    return next(p["eval_reward"] for p in points if p["iteration"] >= fraction * last)


def speedups(runs: dict[str, dict[int, list[dict[str, Any]]]], baseline: str = "diffusionnft",
             fraction: float = 1.0) -> dict[str, dict]:
    """Per run and clock: the baseline's time to reach its own held-out reward at `fraction` of its run
    (1: its final reward) ÷ the run's time to reach it, per seed, then mean and spread. 0 means the run
    never reached it."""
    out: dict[str, dict[str, Any]] = {}
    base = runs[baseline]
    for algorithm, all_seeds in runs.items():
        by_seed = {seed: points for seed, points in all_seeds.items() if seed in base}
        if not by_seed:
            continue
        row: dict[str, Any] = {}
        for clock in ("iteration", "wall_s", "modeled_s"):
            ratios = []
            for seed, points in by_seed.items():
                target = baseline_target(base[seed], fraction)
                reference = first_reach(base[seed], target, clock)
                reached = first_reach(points, target, clock)
                ratios.append(reference / reached if reached > 0 and math.isfinite(reached) else 0.0)
            row[clock] = {"per_seed": ratios, "mean": float(np.mean(ratios)),
                          "min": float(np.min(ratios)), "max": float(np.max(ratios))}
        row["final_eval_reward"] = [pts[-1]["eval_reward"] for pts in by_seed.values()]
        row["final_eval_accuracy"] = [pts[-1].get("eval_accuracy") for pts in by_seed.values()]
        row["base_eval_reward"] = [pts[0]["eval_reward"] for pts in by_seed.values()]
        out[algorithm] = row
    return out


PROFILE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def speedup_profile(runs: dict[str, dict[int, list[dict[str, Any]]]],
                    baseline: str = "diffusionnft") -> dict[str, dict[str, dict]]:
    """Speedups against `baseline` for targets along its run (its reward at ¼, ½, ¾ and the end):
    how the answer depends on where the target sits on the baseline's curve."""
    by_fraction = {f: speedups(runs, baseline, f) for f in PROFILE_FRACTIONS}
    return {algorithm: {str(f): {clock: by_fraction[f][algorithm][clock] for clock in ("iteration", "modeled_s")}
                     for f in PROFILE_FRACTIONS} for algorithm in by_fraction[1.0]}


def format_profile(profile: dict[str, dict[str, dict]], baseline: str) -> str:
    lines = ["| run | " + " | ".join(f"target: {baseline} at {f:g} of its run" for f in PROFILE_FRACTIONS) + " |",
             "|---|" + "---|" * len(PROFILE_FRACTIONS)]
    for name, row in profile.items():
        lines.append(f"| {name} | " + " | ".join(
            f"{describe(row[str(f)]['iteration']['per_seed'], spread=False)} it, "
            f"{describe(row[str(f)]['modeled_s']['per_seed'], spread=False)} modeled"
            for f in PROFILE_FRACTIONS) + " |")
    return "\n".join(lines)


def describe(ratios: list[float], spread: bool = True) -> str:
    """Mean speedup over the seeds that reached the target (0 marks one that did not), saying how many."""
    reached = [r for r in ratios if r > 0]
    if not reached:
        return "not reached"
    text = f"{np.mean(reached):.2f}×" + (f" ({min(reached):.2f}–{max(reached):.2f})" if spread else "")
    return text if len(reached) == len(ratios) else f"{text} [{len(reached)}/{len(ratios)} seeds reached]"


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    lines = ["| run | held-out reward: base → final (mean over seeds) | final accuracy | speedup, iterations | "
             "speedup, wall | speedup, modeled GPU time |", "|---|---|---|---|---|---|"]
    for name, row in summary.items():
        acc = [a for a in row["final_eval_accuracy"] if a is not None]
        cells = [describe(row[c]["per_seed"]) for c in ("iteration", "wall_s", "modeled_s")]
        lines.append(f"| {name} | {np.mean(row['base_eval_reward']):.3f} → {np.mean(row['final_eval_reward']):.3f} | "
                     f"{np.mean(acc) if acc else float('nan'):.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: dict[str, dict[int, list[dict[str, Any]]]], path: Path, ylabel: str = "held-out reward") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    clocks = (("iteration", "iteration"), ("wall_s", "measured wall time (s, CPU)"),
              ("modeled_s", "modeled GPU time (GPU-s at the paper's SD3.5-L rates)"))
    for (clock, label), ax in zip(clocks, axes, strict=True):
        for name, by_seed in runs.items():
            xs = np.array([[p[clock] for p in pts] for pts in by_seed.values()])
            ys = np.array([[p["eval_reward"] for p in pts] for pts in by_seed.values()])
            line, = ax.plot(xs.mean(0), ys.mean(0), marker="o", ms=3, label=name)
            ax.fill_between(xs.mean(0), ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Held-out reward (mean over run seeds, band = min–max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


FLOW_GRPO = ["learner.algorithm=diffusionnft", "learner.objective=flow_grpo", "learner.decay.type=0",
             "sampler.cfg_scale=4.5"]
# Named runs: the settings each adds to the common ones (--set). The four algorithms of the paper, the
# controls, and the ablations of Tables 2 and 3 (Sol-RL with other explore steps, other pool sizes).
RUNS: dict[str, list[str]] = {
    **{a: [f"learner.algorithm={a}"] for a in ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl")},
    "sol_rl_shuffled": ["learner.algorithm=sol_rl", "learner.shuffle_rewards=true"],
    # DiffusionART under each reading of its trust mask (learner.art.TRUST_MASKS)
    **{f"sol_rl_art_{m}": ["learner.algorithm=sol_rl", "learner.objective=art", "learner.decay.type=0",
                           f"learner.art.trust_mask={m}"] for m in ("away_from_target", "trust_region")},
    # the same objective without the pool (K-in-K): the baseline that says whether the pool pays under ART
    "diffusionnft_art": ["learner.algorithm=diffusionnft", "learner.objective=art", "learner.decay.type=0",
                         "learner.art.trust_mask=trust_region"],
    **{f"sol_rl_explore{s}": ["learner.algorithm=sol_rl", f"explore.steps={s}"] for s in (2, 4, 8)},
    **{f"sol_rl_pool{n}": ["learner.algorithm=sol_rl", f"prompts.candidates={n}"] for n in (24, 48, 72)},
    # Flow-GRPO as its source runs it (learner.config.GRPOConfig's and OBJECTIVE_DEFAULTS' defaults): K-in-K like
    # DiffusionNFT, SDE rollouts sampled and trained at CFG 4.5 (the source's `config.sample.guidance_scale`; the
    # embedded model guides: docs/objectives.md), the first 9 of 10 steps (0.99), two optimizer steps on stored
    # log π_old, zero advantages dropped, the EMA every 8th step
    "flow_grpo": [*FLOW_GRPO],
    # the same with the EMA folded after every optimizer step instead of every 8th (the source's): how much
    # of Flow-GRPO's deficit here is the EMA's lag over a 60-iteration run (runnable by name)
    "flow_grpo_ema_every1": [*FLOW_GRPO, "training.ema_every=1"],
    # the same without guidance (CFG 1, as the NFT runs sample): what the source's CFG gives the baseline
    # (runnable by name; the evidence before issue 45 ran Flow-GRPO so)
    "flow_grpo_cfg1": [*FLOW_GRPO, "sampler.cfg_scale=1.0"],
    # adaptive exploration (this project's): every seed f steps, the 48 ends of that ranking finish the 6
    **{f"sol_rl_halving{'' if f == 2 else f}": ["learner.algorithm=sol_rl", "explore.schedule=halving",
                                                  f"explore.halving_steps={f}", "explore.halving_survivors=48"]
       for f in (2, 3)},
    # adaptive exploration by spread (this project's): every prompt 48 seeds, then pools of 72 · std ÷ the
    # previous iteration's median within [48, 96]; each seed 6 steps, scored once. The rule the selection bench
    # measures best (bench.adaptive_explore: a larger selected gap than a uniform 72 at about its cost)
    "sol_rl_spread": ["learner.algorithm=sol_rl", "explore.schedule=spread", "explore.spread_first=48",
                      "explore.spread_rule=proportional"],
    # the all-or-nothing rule: all 96 where the first chunk's std reaches the median, else 48 (not in
    # bench.evidence.PLAN: it selects worse than a uniform 72 at the same cost; run it by name)
    "sol_rl_spread_median": ["learner.algorithm=sol_rl", "explore.schedule=spread", "explore.spread_first=48",
                             "explore.spread_rule=median"],
    # the headline pair, trained until diffusionnft's held-out curve flattens (bench.evidence: LONG)
    **{f"{a}_long": [f"learner.algorithm={a}"] for a in ("diffusionnft", "sol_rl")},
}
BASELINE = "diffusionnft"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runs", "--algorithms", dest="runs", type=lambda s: s.split(","),
                        default=["diffusionnft", "naive_scaling", "naive_quant", "sol_rl"],
                        help=f"named runs, comma-separated: {', '.join(RUNS)}")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--control", action="store_true", help="add sol_rl_shuffled (rewards shuffled)")
    parser.add_argument("--art", action="store_true", help="add sol_rl_art_<reading> for both trust-mask readings "
                        "(the DiffusionART objective)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--resume-dir", type=Path, default=None, help="checkpoint each run at every evaluation "
                        "into DIR/<run>_seed<s>/ and continue a stopped one from there (removed once --json is "
                        "written)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--from-json", action="store_true", help="only re-summarize an existing --json")
    parser.add_argument("--costs", type=Path, default=None, help="per-phase costs (JSON, bench.plan's fields) to "
                        "price the work at instead of the paper's SD3.5-L Table 5")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                        help="combine earlier result files (e.g. one per run) into --json; no training")
    args = parser.parse_args(argv)
    prices = PRICES
    if args.costs:
        costs = load_costs(args.costs)
        prices = prices_from(costs)
        note = measured_note(costs)
        if note:
            print(note)
    if args.from_json:
        rereport(args.json, args.png, prices)
        return
    if args.merge:
        merge(args.merge, args.json, args.png, prices)
        return
    names = args.runs + ["sol_rl_shuffled"] * args.control + [n for n in RUNS if n.startswith("sol_rl_art_")] * args.art
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        parser.error(f"unknown run(s) {', '.join(unknown)}: choose from {', '.join(RUNS)}")
    torch.set_num_threads(args.threads)

    common = [*args.set, f"run.iterations={args.iterations}", f"eval.every={args.eval_every}"]
    configs = {name: load_config(args.config, common + RUNS[name]) for name in names}  # fail early

    runs: dict[str, dict[int, list[dict[str, Any]]]] = {name: {} for name in names}
    folders = {(name, seed): args.resume_dir / f"{name}_seed{seed}" if args.resume_dir else None
               for seed in args.seeds for name in names}
    for seed in args.seeds:
        for name, config in configs.items():
            print(f"== {name}, run seed {seed}", flush=True)
            runs[name][seed] = run_one(config.model_copy(update={"run": config.run.model_copy(update={"seed": seed})}),
                                       print, folders[name, seed])
    report(runs, {k: v for k, v in vars(args).items() if k != "resume_dir"}, args.json, args.png, prices)
    for folder in folders.values():
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def report(runs: dict[str, dict[int, list[dict[str, Any]]]], settings: dict, json_path: Path,
           png: Path | None, prices: dict[str, float] = PRICES) -> None:
    """Modeled time, tables against diffusionnft (and naive_scaling when it ran), the JSON, the PNG."""
    add_modeled_cost(runs, prices)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    if BASELINE not in runs:  # one run of a larger set: its file is merged with the baseline's later
        json_path.write_text(json.dumps({"prices_gpu_s": prices, "args": _jsonable(settings), "runs": runs},
                                        indent=1) + "\n")
        print(f"wrote {json_path} (no {BASELINE} run here: merge with one for speedups)")
        return
    print("modeled GPU time: counted work at " + ("the paper's SD3.5-L prices (scored images at the midpoint "
          "of the decode + reward price Table 5 allows)" if prices is PRICES else "the --costs prices")
          + " (GPU-s): " + ", ".join(f"{key} {price:.4g}" for key, price in prices.items()))
    summaries = {f"vs_{b}": speedups(runs, b) for b in ("diffusionnft", "naive_scaling") if b in runs}
    for name, summary in summaries.items():
        print(f"\nspeedup {name.replace('_', ' ')} (target: its final held-out reward)")
        print(format_table(summary))
    for baseline in ("diffusionnft", "naive_scaling"):
        if baseline in runs:
            summaries[f"profile_vs_{baseline}"] = profile = speedup_profile(runs, baseline)
            print(f"\nspeedup vs {baseline.replace('_', ' ')} for targets along its run (mean over seeds)")
            print(format_profile(profile, baseline))
    json_path.write_text(json.dumps({"prices_gpu_s": prices, "args": _jsonable(settings),
                                     "summary": summaries, "runs": runs}, indent=1) + "\n")
    if png:
        plot(runs, png)
        print(f"wrote {png}")
    print(f"wrote {json_path}")


def _jsonable(settings: dict) -> dict:
    return {k: v if isinstance(v, dict) else str(v) for k, v in settings.items()}


def load_runs(path: Path) -> tuple[dict[str, dict[int, list[dict[str, Any]]]], dict]:
    data = json.loads(path.read_text())
    return {name: {int(seed): pts for seed, pts in by_seed.items()} for name, by_seed in data["runs"].items()}, data


def merge(sources: list[Path], json_path: Path, png: Path | None, prices: dict[str, float] = PRICES) -> None:
    """One report from several result files, e.g. one invocation per run seed, so a long benchmark
    survives a crash seed by seed. Every algorithm of a seed is costed with that seed's own c."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    settings = {}
    for source in sources:
        loaded, data = load_runs(source)
        for name, by_seed in loaded.items():
            for seed, points in by_seed.items():
                if seed in runs.setdefault(name, {}):
                    raise SystemExit(f"{source}: {name} with run seed {seed} is already in an earlier file")
                runs[name][seed] = points
        settings[str(source)] = data["args"]
    missing = {name: sorted(set(by_seed) - set(runs.get("diffusionnft", {}))) for name, by_seed in runs.items()}
    missing = {name: seeds for name, seeds in missing.items() if seeds}
    if missing:
        raise SystemExit(f"diffusionnft sets each seed's target but has no run for {missing}: merge its runs too")
    report(runs, {"merged": settings}, json_path, png, prices)


def rereport(json_path: Path, png: Path | None, prices: dict[str, float] = PRICES) -> None:
    """Recompute the tables and the PNG from a previous run's JSON (no training)."""
    runs, data = load_runs(json_path)
    report(runs, data["args"], json_path, png, prices)


if __name__ == "__main__":
    main()
