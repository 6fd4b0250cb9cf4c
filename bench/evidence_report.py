"""The evidence suite's report: every run file merged, the paper's tables rebuilt beside its numbers,
figures with per-seed bands, and where the pool pays. Written by `python -m bench.evidence --report` (no
training).

Outputs: `docs/evidence.md` (the tables, generated: edit this module, not the file), the same tables
between the `<!-- evidence:begin/end -->` markers of `docs/benchmarks.md` (its prose stays hand-written),
`bench/results/evidence.json` (the tables' numbers and every run's points), `bench/results/evidence_<group>.png`
and `bench/results/evidence_speedup.png`.

Every table is a pure function of the loaded runs (`load_all`: run name → run seed → points, each point with
cumulative counters, its held-out `eval_*` numbers, `modeled_s` at the default prices, and for runs recorded
since the update's numbers were logged an `objective` dict: each of the update's numbers averaged over the
iterations since the previous point). A run the suite has not made yet is shown as pending, never dropped
silently. Modeled GPU time is `bench.convergence.modeled_cost` at `bench.prices`' table; the sections that
depend on the decode + reward price d (the break-even price, the adaptive schedules) are repriced at d = 0,
the default and the bracket's upper end.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from bench import adaptive_explore, rank_fidelity
from bench.convergence import BASELINE, add_modeled_cost, first_reach, load_runs, modeled_cost, plot, speedups
from bench.evidence_plan import ART_READINGS, ITERATIONS, PLAN, PREVIOUS_CHANGE, PREVIOUS_NAMES
from bench.plan import PlanError, load_costs
from bench.prices import D_DEFAULT, D_HIGH, D_LOW, IDEAL_FP4_RATIO, fp4_ratio_at, prices_at

Runs = dict[str, dict[int, list[dict[str, Any]]]]
Points = list[dict[str, Any]]

# The paper's rows (REFERENCE §1; HPSv2 unless said): what each table is put beside.
PAPER_CONVERGENCE = ("The paper: Sol-RL reaches DiffusionNFT's final reward 1.91× to 4.64× faster in training "
                     "time (SANA 2.42×, FLUX 3.00×, SD3.5-L 4.64× on ImageReward); naive_quant peaks lower "
                     "(HPSv2 ≈ 0.3595 against ≈ 0.3705).")
PAPER_TABLE_1 = {"flow_grpo": 0.3501, "diffusionnft": 0.3613, "sol_rl": 0.3688}  # FLUX, equal GPU-hours
PAPER_TABLE_2 = {2: 0.3587, 4: 0.3650, 6: 0.3686, 8: 0.3659}  # explore steps, SD3.5-M?, HPSv2
PAPER_TABLE_3 = {24: 0.3569, 48: 0.3622, 72: 0.3663, 96: 0.3686}  # pool size N with K = 24
PAPER_FP4_RATIO = 0.46  # the paper's quoted Blackwell NVFP4 step ÷ BF16 step (Table 5 at d = 0: 0.4619)
EXPLORE_RUNS = {2: "sol_rl_explore2", 4: "sol_rl_explore4", 6: "sol_rl", 8: "sol_rl_explore8"}
POOL_RUNS = {24: "sol_rl_pool24", 48: "sol_rl_pool48", 72: "sol_rl_pool72", 96: "sol_rl"}
FIXED = "sol_rl"  # Sol-RL's fixed explore pass: what the adaptive schedules are judged against
ADAPTIVE_RUNS = ("sol_rl_halving", "sol_rl_halving3", "sol_rl_spread")
LONG_BASELINE, LONG_RUN = "diffusionnft_long", "sol_rl_long"
ART_BASELINE = "diffusionnft_art"  # DiffusionART without the pool: the pool's worth under ART
CONVERGENCE_RUNS = ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl", *ADAPTIVE_RUNS, "flow_grpo",
                    "sol_rl_shuffled", *ART_READINGS, ART_BASELINE)
LONG_RUNS = (LONG_BASELINE, LONG_RUN)
FIGURES = {"algorithms": ("diffusionnft", "naive_scaling", "naive_quant", "sol_rl", "flow_grpo"),
           "explore_steps": tuple(EXPLORE_RUNS.values()), "pool_size": tuple(POOL_RUNS.values()),
           "controls": ("diffusionnft", "sol_rl", "sol_rl_shuffled", *ART_READINGS, ART_BASELINE),
           "adaptive": ("diffusionnft", "sol_rl", *ADAPTIVE_RUNS), "long": LONG_RUNS}
FIGURE_BASELINES = {"long": LONG_BASELINE}
# Runs the report's sections expect beyond the suite's PLAN (3 seeds of every adaptive schedule).
EXPECTED_SEEDS = (0, 1, 2)
LEVELS = tuple(i / 10 for i in range(1, 11))  # fractions of the way from the base reward to the baseline's final
BUDGETS = (0.25, 0.5, 0.75, 1.0)  # fractions of the equal-time budget
D_SETTINGS = (("d = 0 (bracket's low end)", D_LOW), ("d default (midpoint)", D_DEFAULT),
              ("d high (bracket's high end)", D_HIGH))
GRPO_NUMBERS = ("clip_fraction", "step1_clip_fraction", "step2_clip_fraction", "ratio_mean", "step2_ratio_mean",
                "approx_kl", "step2_approx_kl")
PENDING = "pending"
FLOW_GRPO_CFG_NOTE = ("Each run samples, trains and is evaluated at its source's guidance: Flow-GRPO at CFG 4.5 "
                      "(two forwards a step, counted in its modeled time), DiffusionNFT and Sol-RL at CFG 1 (their "
                      "source is CFG-free). So Flow-GRPO starts from a higher held-out reward (the base model "
                      "guided: `bench/results/base_model_cfg.json`); read its gain as well as its level.")
# Flow-GRPO with one setting changed (bench.convergence.RUNS; the plan makes them after the third seeds):
# variant → (the setting, the source's value, the variant's, the question the pair answers)
GRPO_VARIANTS = {
    "flow_grpo_ema_every1": ("EMA folded", "every 8th optimizer step (the source)", "every optimizer step",
                             "The EMA interval's share of Flow-GRPO's result"),
    "flow_grpo_cfg1": ("guidance", "CFG 4.5 (the source)", "CFG 1 (the previous evidence's)",
                       "What the source's guidance gives Flow-GRPO (each evaluated at its own CFG)"),
}


def load_all(run_dir: Path) -> Runs:
    runs: Runs = {}
    for path in sorted(run_dir.glob("*.json")):
        loaded, _ = load_runs(path)
        for name, by_seed in loaded.items():
            runs.setdefault(name, {}).update(by_seed)
    add_modeled_cost(runs)
    return runs


def reward_at(points: Points, clock: str, when: float) -> float:
    """The held-out reward at `when` on `clock`, interpolated between evaluations (nan past the run)."""
    xs, ys = [p[clock] for p in points], [p["eval_reward"] for p in points]
    return float(np.interp(when, xs, ys)) if when <= xs[-1] else math.nan


def spread(values: list[float], digits: int = 3) -> str:
    """mean (min–max) [per seed: a, b, c] over the finite values; a seed whose value is not finite (a target
    never reached) shows as "never", and is left out of the mean."""
    finite = [v for v in values if math.isfinite(v)]
    per_seed = ", ".join(f"{v:.{digits}f}" if math.isfinite(v) else "never" for v in values)
    if not finite:
        return f"never [{per_seed}]"
    return f"{np.mean(finite):.{digits}f} ({min(finite):.{digits}f}–{max(finite):.{digits}f}) [{per_seed}]"


def logged(xs: list[float], digits: int = 3) -> str:
    """Like `spread`, for numbers where a non-finite value means "not logged" rather than "never"."""
    finite = [v for v in xs if math.isfinite(v)]
    if not finite:
        return "not logged"
    per_seed = ", ".join(f"{v:.{digits}f}" if math.isfinite(v) else "—" for v in xs)
    return f"{np.mean(finite):.{digits}f} ({min(finite):.{digits}f}–{max(finite):.{digits}f}) [{per_seed}]"


def finite_mean(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return float(np.mean(finite)) if finite else math.nan


def never_as_nan(ratios: list[float]) -> list[float]:
    """`speedups` writes 0 for a run that never reached the target: shown as "never", not as a speedup."""
    return [r if r > 0 else math.nan for r in ratios]


def seeds_of(runs: Runs, names: tuple[str, ...] | list[str], baseline: str = BASELINE) -> list[int]:
    """The seeds every run of `names` that exists has, and the baseline too."""
    present = [runs[n] for n in names if n in runs] + [runs.get(baseline, {})]
    return sorted(set.intersection(*(set(r) for r in present))) if present else []


def missing(runs: Runs, names: tuple[str, ...] | list[str]) -> list[str]:
    return [n for n in names if n not in runs]


def pending_note(runs: Runs, names: tuple[str, ...] | list[str]) -> str:
    """One line naming the runs of a section that have no file yet ("" when none is missing)."""
    absent = missing(runs, names)
    return f"\n\nPending (no run file yet): {', '.join(f'`{n}`' for n in absent)}." if absent else ""


def repriced(runs: Runs, prices: dict[str, float]) -> Runs:
    """A copy of `runs` whose points' `modeled_s` is Σ counter × `prices` (the counters are unchanged)."""
    return {name: {seed: [{**p, "modeled_s": modeled_cost(p, prices)} for p in points]
                   for seed, points in by_seed.items()} for name, by_seed in runs.items()}


def lp_prices(d: float, q: float) -> dict[str, float]:
    """The price table at decode + reward price d with a low-precision step priced q·c_b (c_b: the table's
    full-precision pool step at d)."""
    prices = prices_at(d)
    prices["lp_sample_steps"] = q * prices["fp_pool_sample_steps"]
    return prices


def objective_numbers(points: Points, key: str) -> list[tuple[int, float]]:
    """(iterations n_i since the previous point, v_i) of every point whose `objective` logged `key` finitely."""
    out = []
    for previous, point in itertools.pairwise(points):
        value = point.get("objective", {}).get(key)
        if value is not None and math.isfinite(value):
            out.append((point["iteration"] - previous["iteration"], float(value)))
    return out


def objective_mean(points: Points, key: str) -> float:
    """The run's mean of an update number: Σ n_i·v_i / Σ n_i over its points (v_i: the point's mean over the
    n_i iterations since the previous one), i.e. the mean over every iteration that logged it; nan if none."""
    numbers = objective_numbers(points, key)
    total = sum(n for n, _ in numbers)
    return sum(n * v for n, v in numbers) / total if total else math.nan


def objective_max(points: Points, key: str) -> float:
    """max_i v_i: the largest of the points' means (each over a few iterations; a single iteration's
    maximum is not recorded); nan if none."""
    numbers = objective_numbers(points, key)
    return max(v for _, v in numbers) if numbers else math.nan


def deepest_dip(points: Points, key: str = "eval_accuracy") -> tuple[float, int, float]:
    """The run's largest drawdown of a held-out number: i* = argmax_i (max_{j<i} a_j − a_i); returns
    (a_{i*}, iteration of i*, max_{j<i*} a_j − a_{i*}). A run that never drops returns its last point, 0."""
    best = (points[-1][key], points[-1]["iteration"], 0.0)
    peak = points[0][key]
    for p in points[1:]:
        if peak - p[key] > best[2]:
            best = (p[key], p["iteration"], peak - p[key])
        peak = max(peak, p[key])
    return best


# Convergence (the paper's Table 6 protocol)

def convergence_table(runs: Runs, names: tuple[str, ...] = CONVERGENCE_RUNS,
                      baseline: str = BASELINE) -> tuple[str, dict]:
    """Per run: final held-out reward, accuracy and log p, and `bench.convergence.speedups` against
    `baseline`: (baseline's time to its own final held-out reward) ÷ (the run's time to reach it), per seed,
    in iterations and in modeled GPU time. A run without a file is a "pending" row."""
    present = [n for n in names if n in runs]
    ordered = {n: runs[n] for n in ([baseline] if baseline in runs else []) + [n for n in present if n != baseline]}
    summary = speedups(ordered, baseline) if baseline in runs else {}
    lines = [f"| run | seeds | final held-out `digit_margin` | final accuracy | final log p (`digit_alignment`) | "
             f"speedup to {baseline}'s final reward, iterations | speedup, modeled GPU time |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        row = summary.get(name)
        if row is None:
            why = PENDING if name not in runs else f"no seed shared with {baseline}"
            lines.append(f"| {name} | {why} | — | — | — | — | — |")
            continue
        seeds = [s for s in runs[name] if s in runs[baseline]]  # the order of `speedups`' per-seed lists
        alignment = [runs[name][s][-1].get("eval_digit_alignment", math.nan) for s in seeds]
        accuracy = [math.nan if a is None else a for a in row["final_eval_accuracy"]]
        lines.append(f"| {name} | {len(seeds)} | {spread(row['final_eval_reward'])} | "
                     f"{spread(accuracy)} | {spread(alignment)} | "
                     f"{spread(never_as_nan(row['iteration']['per_seed']), 2)} | "
                     f"{spread(never_as_nan(row['modeled_s']['per_seed']), 2)} |")
    return "\n".join(lines), summary


# Table 1 and Flow-GRPO's update

def equal_time_table(runs: Runs) -> tuple[str, dict]:
    """Table 1: each run's held-out reward at the budget every run of the table reached (per seed: the
    smallest final modeled time among them); a run without a file is a "pending" row (the budget is then
    the present runs')."""
    names = [n for n in PAPER_TABLE_1 if n in runs]
    seeds = seeds_of(runs, names)
    out: dict[str, Any] = {"seeds": seeds, "budget_s": {}, "reward": {n: [] for n in names},
                           "start": {n: [] for n in names}, "pending": missing(runs, list(PAPER_TABLE_1))}
    for seed in seeds:
        budget = min(runs[n][seed][-1]["modeled_s"] for n in names)
        out["budget_s"][seed] = budget
        for n in names:
            out["reward"][n].append(reward_at(runs[n][seed], "modeled_s", budget))
            out["start"][n].append(runs[n][seed][0]["eval_reward"])
    lines = ["| run | held-out `digit_margin` at equal modeled GPU time | at iteration 0 (its own CFG) | "
             "paper (FLUX, HPSv2) |", "|---|---|---|---|"]
    lines += [f"| {n} | {spread(out['reward'][n]) if n in runs else PENDING} | "
              f"{spread(out['start'][n]) if n in runs else PENDING} | {PAPER_TABLE_1[n]:.4f} |" for n in PAPER_TABLE_1]
    return "\n".join(lines), out


def grpo_objective_table(runs: Runs, name: str = "flow_grpo") -> tuple[str, dict]:
    """Flow-GRPO's update as logged: per seed, `objective_mean` of each number of `GRPO_NUMBERS` over the
    run (clip_fraction: the share of ratios π_θ/π_old outside 1 ± clip_range; stepN_*: the N-th optimizer
    step's; ratio_mean; approx_kl = ½·mean (log π_θ − log π_old)²), then mean (min–max) over seeds. The clip
    binds when the clipped share is above 0: from the second optimizer step on, θ has moved off θ_old."""
    if name not in runs:
        return f"Flow-GRPO's update: {PENDING} (no `{name}` run file yet).", {"pending": True}
    seeds = sorted(runs[name])
    out = {key: [objective_mean(runs[name][s], key) for s in seeds] for key in GRPO_NUMBERS}
    out["seeds"] = seeds
    if not any(math.isfinite(v) for key in GRPO_NUMBERS for v in out[key]):
        return (f"Flow-GRPO's update: not logged (the `{name}` run files predate the `objective` record).",
                {**out, "binds": None})
    lines = ["| Flow-GRPO update, mean over the run | mean (min–max) [per seed] |", "|---|---|"]
    lines += [f"| {key} | {logged(out[key], 4)} |" for key in GRPO_NUMBERS]
    clipped = finite_mean(out["clip_fraction"])
    out["binds"] = bool(clipped > 0)
    lines += ["", (f"The clip binds: {100 * clipped:.1f}% of the ratios lie outside the clip range over the run "
                   f"({100 * finite_mean(out['step2_clip_fraction']):.1f}% on the second optimizer step, "
                   f"{100 * finite_mean(out['step1_clip_fraction']):.1f}% on the first)." if clipped > 0 else
                   "The clip never binds: no ratio left the clip range.")]
    return "\n".join(lines), out


def grpo_variant_note(runs: Runs, variant: str, name: str = "flow_grpo") -> tuple[str, dict]:
    """`name` (Flow-GRPO as its source runs it) beside `variant` (one setting changed: `GRPO_VARIANTS`) on
    the seeds both have: held-out reward at iteration 0 and at the end, final accuracy, per seed. The variant
    is not in the plan: without its file the note says how to make it."""
    topic, source_label, variant_label, question = GRPO_VARIANTS[variant]
    seeds = sorted(set(runs.get(name, {})) & set(runs.get(variant, {})))
    if not seeds:
        return (f"{question}: not measured (`python -m bench.convergence --runs {variant} --seeds 0 --iterations "
                f"{ITERATIONS} --set \"reward.weights={{digit_margin: 1.0}}\" --json "
                f"bench/results/runs/{variant}_seed0.json`).", {"seeds": []})
    out: dict[str, Any] = {"seeds": seeds}
    for run in (name, variant):
        out[run] = {"start_reward": [runs[run][s][0]["eval_reward"] for s in seeds],
                    "final_reward": [runs[run][s][-1]["eval_reward"] for s in seeds],
                    "final_accuracy": [runs[run][s][-1].get("eval_accuracy", math.nan) for s in seeds]}
    lines = [f"{question}:", "", f"| Flow-GRPO, {topic} | seeds | held-out reward at iteration 0 | final held-out "
             "reward | final accuracy |", "|---|---|---|---|---|"]
    lines += [f"| {label} (`{run}`) | {seeds} | {spread(out[run]['start_reward'])} | "
              f"{spread(out[run]['final_reward'])} | {spread(out[run]['final_accuracy'])} |"
              for label, run in ((source_label, name), (variant_label, variant))]
    return "\n".join(lines), out


# DiffusionART, the two readings

def art_table(runs: Runs, readings: tuple[str, ...] = ART_READINGS, without_pool: tuple[str, ...] = (ART_BASELINE,),
              references: tuple[str, ...] = (BASELINE, FIXED)) -> tuple[str, dict]:
    """Per reading of DiffusionART's trust mask (and, for reference, `references`): final held-out reward
    and accuracy; the deepest dip of held-out accuracy (`deepest_dip`: the accuracy, where, and the drop from
    the peak before it); drift_kl's `objective_mean` and `objective_max` (the mean SDE KL of θ against θ_old
    after an iteration's update); window1_ and window2_masked_fraction (the share of states the trust mask
    removed); window2_restore_to_guidance (window 2's restoration (v_θ − v_old)² ÷ the guidance's
    (v* − v_old)²). The verdict compares the readings' per-seed max drift_kl and accuracy drop, mean over
    seeds, and says whether their seed ranges overlap. `without_pool` (DiffusionART K-in-K, the default
    reading) is shown with its logs when present, outside the verdict."""
    out: dict[str, Any] = {"pending": missing(runs, readings)}
    lines = ["| run | seeds | final held-out reward | final accuracy | deepest accuracy dip: accuracy @ iteration | "
             "drop from the peak before it | drift_kl mean | drift_kl max | window 1 masked | window 2 masked | "
             "window 2 restore ÷ guidance |", "|---" * 11 + "|"]
    for name in (*readings, *without_pool, *references):
        if name not in runs:
            if name not in without_pool:
                lines.append(f"| {name} | {PENDING} |" + " — |" * 9)
            continue
        seeds = sorted(runs[name])
        pts = [runs[name][s] for s in seeds]
        dips = [deepest_dip(p) for p in pts]
        row = {"seeds": seeds, "final_reward": [p[-1]["eval_reward"] for p in pts],
               "final_accuracy": [p[-1].get("eval_accuracy", math.nan) for p in pts],
               "dip_accuracy": [d[0] for d in dips], "dip_iteration": [d[1] for d in dips],
               "dip_drop": [d[2] for d in dips],
               "drift_kl_mean": [objective_mean(p, "drift_kl") for p in pts],
               "drift_kl_max": [objective_max(p, "drift_kl") for p in pts],
               **{f"{key}_mean": [objective_mean(p, key) for p in pts] for key in (
                   "window1_masked_fraction", "window2_masked_fraction", "window2_restore_to_guidance")}}
        out[name] = row
        where = ", ".join(f"{a:.3f} @ {i}" for a, i in zip(row["dip_accuracy"], row["dip_iteration"], strict=True))
        art = name in readings or name in without_pool
        cells = [logged(row[k], 4) if art else "—" for k in (
            "drift_kl_mean", "drift_kl_max", "window1_masked_fraction_mean", "window2_masked_fraction_mean",
            "window2_restore_to_guidance_mean")]
        lines.append(f"| {name} | {len(seeds)} | {spread(row['final_reward'])} | {spread(row['final_accuracy'])} | "
                     f"{np.mean(row['dip_accuracy']):.3f} [{where}] | {spread(row['dip_drop'])} | "
                     + " | ".join(cells) + " |")
    out["verdict"] = art_verdict(out, readings, references)
    return "\n".join(lines) + "\n\n" + out["verdict"] + pending_note(runs, readings), out


def _separated(a: list[float], b: list[float]) -> bool:
    fa, fb = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    return bool(fa and fb and (max(fa) < min(fb) or max(fb) < min(fa)))


def art_verdict(table: dict, readings: tuple[str, ...], references: tuple[str, ...]) -> str:
    """Which reading bounds drift (the lower mean over seeds of per-seed max drift_kl) and which holds accuracy
    (the smaller mean drop of its deepest accuracy dip): a reading is named only where the two readings'
    per-seed ranges do not overlap (outside the seed spread); otherwise the verdict says they do not separate.
    The references' drops are put beside."""
    present = [r for r in readings if r in table]
    if len(present) < 2:
        return f"Verdict: {PENDING} (needs both readings; present: {', '.join(present) or 'none'})."
    a, b = present[:2]
    winners, parts = [], []
    for key, what, verb, digits in (("drift_kl_max", "max drift_kl", "bounds drift", 4),
                                    ("dip_drop", "deepest accuracy drop", "holds accuracy", 3)):
        mean = {r: finite_mean(table[r][key]) for r in (a, b)}
        if not all(math.isfinite(v) for v in mean.values()):
            parts.append(f"{what} is not logged for both readings")
            continue
        low, high = sorted((a, b), key=mean.get)
        if _separated(table[a][key], table[b][key]):
            winners.append(low)
            parts.append(f"`{low}` {verb} better ({what} {mean[low]:.{digits}f} against {mean[high]:.{digits}f}, "
                         "mean over seeds; outside the seed spread)")
        else:
            parts.append(f"{what} does not separate the readings ({mean[a]:.{digits}f} for `{a}`, "
                         f"{mean[b]:.{digits}f} for `{b}`: their seed ranges overlap)")
    refs = ", ".join(f"{r} {finite_mean(table[r]['dip_drop']):.3f}" for r in references if r in table)
    both = f" `{winners[0]}` does both." if len(winners) == 2 and winners[0] == winners[1] else ""
    return "Verdict: " + "; ".join(parts) + (f" (deepest accuracy drop for reference: {refs})" if refs else "") \
        + "." + both


# Where the pool pays

def pool_pair(runs: Runs) -> tuple[str, str, str] | None:
    """(baseline, run, note): the `_long` pair when both have a common seed, else the 60-iteration
    diffusionnft / sol_rl with a note saying so; None when neither pair exists."""
    if LONG_BASELINE in runs and LONG_RUN in runs and set(runs[LONG_BASELINE]) & set(runs[LONG_RUN]):
        length = max(p[-1]["iteration"] for p in runs[LONG_RUN].values())
        return LONG_BASELINE, LONG_RUN, f"From the long pair ({length} iterations), trained until {LONG_BASELINE}'s " \
                                        "held-out curve flattens."
    if BASELINE in runs and FIXED in runs and set(runs[BASELINE]) & set(runs[FIXED]):
        absent = ", ".join(f"`{n}`" for n in LONG_RUNS if n not in runs) or "no common seed"
        return BASELINE, FIXED, (f"The long pair is {PENDING} ({absent}): from the {ITERATIONS}-iteration "
                                 f"`{BASELINE}` / `{FIXED}`, whose curves have not flattened, so the high levels "
                                 "sit on a still-rising line.")
    return None


def level_speedup(base: Points, run: Points, fraction: float, clock: str) -> float:
    """At the level L = r_0 + fraction·(r_final − r_0) of the baseline's held-out reward (r_0 at iteration 0,
    r_final its last evaluation): the baseline's time to first reach L ÷ the run's (`first_reach`, crossings
    interpolated); nan if the run never reaches L. fraction = 1 is the convergence table's speedup."""
    r0, r1 = base[0]["eval_reward"], base[-1]["eval_reward"]
    level = r0 + fraction * (r1 - r0)
    reference, reached = first_reach(base, level, clock), first_reach(run, level, clock)
    return reference / reached if 0 < reached < math.inf else math.nan


def equal_time_gap(base: Points, run: Points, fraction: float) -> tuple[float, float, float]:
    """At budget B = fraction × min(both runs' final modeled time): (B, r_run(B) − r_base(B),
    (r_run(B) − r_0)/(r_base(B) − r_0)), r(B) interpolated between evaluations and r_0 the baseline's
    iteration-0 reward (a ratio of gains: the reward's zero is arbitrary, log-odds can be negative)."""
    budget = fraction * min(base[-1]["modeled_s"], run[-1]["modeled_s"])
    r0 = base[0]["eval_reward"]
    rb, rr = reward_at(base, "modeled_s", budget), reward_at(run, "modeled_s", budget)
    gain = (rr - r0) / (rb - r0) if rb != r0 else math.nan
    return budget, rr - rb, gain


def pool_pays_table(runs: Runs, baseline: str, run: str, levels: tuple[float, ...] = LEVELS,
                    budgets: tuple[float, ...] = BUDGETS) -> tuple[str, dict]:
    """Per seed shared by `baseline` and `run`: `level_speedup` at each fraction of `levels` in modeled GPU
    time and in iterations (the last level, 1.0, is the speedup to the baseline's final reward), and
    `equal_time_gap` at each fraction of `budgets`."""
    seeds = sorted(set(runs[baseline]) & set(runs[run]))
    pairs = [(runs[baseline][s], runs[run][s]) for s in seeds]
    out: dict[str, Any] = {"baseline": baseline, "run": run, "seeds": seeds, "levels": {}, "equal_time": {}}
    for f in levels:
        out["levels"][f] = {
            "level": [b[0]["eval_reward"] + f * (b[-1]["eval_reward"] - b[0]["eval_reward"]) for b, _ in pairs],
            **{clock: [level_speedup(b, r, f, clock) for b, r in pairs] for clock in ("modeled_s", "iteration")}}
    for f in budgets:
        cells = [equal_time_gap(b, r, f) for b, r in pairs]
        out["equal_time"][f] = {"budget_s": [c[0] for c in cells], "difference": [c[1] for c in cells],
                                "gain_ratio": [c[2] for c in cells]}
    lines = [f"Speedup of `{run}` over `{baseline}` per level of `{baseline}`'s held-out reward (level f: "
             f"r_0 + f·(r_final − r_0); speedup = {baseline}'s time to first reach it ÷ {run}'s; seeds {seeds}):",
             "", "| level f | level (held-out reward, mean) | speedup, modeled GPU time | speedup, iterations |",
             "|---|---|---|---|"]
    for f in levels:
        row = out["levels"][f]
        lines.append(f"| {f:.0%} | {np.mean(row['level']):.3f} | {spread(row['modeled_s'], 2)} | "
                     f"{spread(row['iteration'], 2)} |")
    final = out["levels"][levels[-1]]
    lines += ["", f"To `{baseline}`'s final reward: {spread(final['modeled_s'], 2)} in modeled GPU time, "
              f"{spread(final['iteration'], 2)} per iteration. {pays_sentence(out)}", "",
              f"Held-out reward at equal modeled GPU time (budget: a fraction of the smaller final modeled time of "
              f"the two; gain ratio = (r_{run} − r_0)/(r_{baseline} − r_0)):", "",
              f"| budget | modeled GPU-s (mean) | {run} − {baseline} | gain ratio |", "|---|---|---|---|"]
    for f in budgets:
        row = out["equal_time"][f]
        lines.append(f"| {f:.0%} | {np.mean(row['budget_s']):.0f} | {logged(row['difference'])} | "
                     f"{logged(row['gain_ratio'])} |")
    return "\n".join(lines), out


def art_pool_section(runs: Runs, gpu_check: Path | None, baseline: str = ART_BASELINE,
                     run: str = ART_READINGS[1]) -> tuple[str, dict, dict]:
    """The pool's worth under the other objective: `pool_pays_table` and `break_even_table` of Sol-RL with
    DiffusionART (the default trust mask) against DiffusionART without the pool, on their common seeds."""
    if not (baseline in runs and run in runs and set(runs[baseline]) & set(runs[run])):
        absent = ", ".join(f"`{n}`" for n in (baseline, run) if n not in runs) or "no common seed"
        return f"{PENDING} ({absent}).", {}, {}
    text, pays = pool_pays_table(runs, baseline, run)
    be_text, be = break_even_table(runs, baseline, run, gpu_check)
    return f"{text}\n\nBreak-even price of a low-precision step under DiffusionART:\n\n{be_text}", pays, be


def pays_sentence(table: dict) -> str:
    """Which levels the pool pays at (every seed's modeled speedup ≥ 1), costs at (every seed's < 1 or never),
    and where the seeds disagree."""
    pays, costs, mixed = [], [], []
    for f, row in table["levels"].items():
        s = row["modeled_s"]
        if all(math.isfinite(x) and x >= 1 for x in s):
            pays.append(f)
        elif all(not math.isfinite(x) or x < 1 for x in s):
            costs.append(f)
        else:
            mixed.append(f)

    def fmt(fs: list[float]) -> str:
        return ", ".join(f"{f:.0%}" for f in fs) or "none"

    return (f"In modeled GPU time the pool pays (every seed ≥ 1×) at levels {fmt(pays)}; it costs (every seed "
            f"< 1× or never) at {fmt(costs)}; the seeds disagree at {fmt(mixed)}.")


def plot_speedup(table: dict, path: Path) -> None:
    """The level speedup curve (mean, min–max band over seeds; modeled GPU time and iterations) and the
    reward difference at equal modeled time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    fs = sorted(table["levels"])
    for clock, label in (("modeled_s", "modeled GPU time"), ("iteration", "iterations")):
        ys = np.array([table["levels"][f][clock] for f in fs], dtype=float)  # [levels, seeds]
        line, = axes[0].plot(fs, np.nanmean(ys, 1), marker="o", label=label)
        axes[0].fill_between(fs, np.nanmin(ys, 1), np.nanmax(ys, 1), color=line.get_color(), alpha=0.2)
    axes[0].axhline(1.0, color="grey", lw=1, ls="--")
    axes[0].set_xlabel(f"level: fraction of the way from the base reward to {table['baseline']}'s final")
    axes[0].set_ylabel(f"speedup of {table['run']} over {table['baseline']}")
    axes[0].legend()
    bs = sorted(table["equal_time"])
    ys = np.array([table["equal_time"][b]["difference"] for b in bs], dtype=float)
    axes[1].plot(bs, np.nanmean(ys, 1), marker="o")
    axes[1].fill_between(bs, np.nanmin(ys, 1), np.nanmax(ys, 1), alpha=0.2)
    axes[1].axhline(0.0, color="grey", lw=1, ls="--")
    axes[1].set_xlabel("budget: fraction of the smaller final modeled GPU time")
    axes[1].set_ylabel(f"held-out reward, {table['run']} − {table['baseline']}")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"Where the pool pays (seeds {table['seeds']}; mean, band = min–max)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# Break-even price of a low-precision step

def break_even_q(base: Points, run: Points, d: float) -> float:
    """The q at which the run's modeled time to the baseline's final reward equals the baseline's, a
    low-precision step priced q·c_b and everything else at the price table at d. Every point's modeled time
    is linear in q (A + q·c_b·lp_steps), and `first_reach` interpolates with weights set by the rewards
    alone, so each time to target is linear too: T(q) = T(0) + q·(T(1) − T(0)); solving
    T_run(q) = T_base(q) gives q* = (T_base(0) − T_run(0)) / ((T_run(1) − T_run(0)) − (T_base(1) − T_base(0))).
    nan when the run never reaches the target or its time does not depend on q; q* < 0 means even free
    low-precision steps would not break even."""
    target = base[-1]["eval_reward"]

    def time(points: Points, q: float) -> float:
        prices = lp_prices(d, q)
        return first_reach([{**p, "modeled_s": modeled_cost(p, prices)} for p in points], target, "modeled_s")

    run0, run1, base0, base1 = time(run, 0.0), time(run, 1.0), time(base, 0.0), time(base, 1.0)
    slope = (run1 - run0) - (base1 - base0)
    if not all(math.isfinite(t) for t in (run0, run1, base0, base1)) or slope == 0:
        return math.nan
    return (base0 - run0) / slope


def measured_fp8_ratios(gpu_check: Path) -> dict[str, float]:
    """q of a measured FP8 step per model: explore_s_per_sample_step ÷ regen_s_per_sample_step of
    `bench.gpu_check`'s costs_<model>.json (its FP8 and BF16 transformer steps, decode excluded)."""
    out = {}
    for path in sorted(gpu_check.glob("costs_*.json")):
        try:
            costs = load_costs(path)
        except PlanError:
            continue
        if costs.regen_s_per_sample_step > 0:
            out[path.stem.removeprefix("costs_")] = costs.explore_s_per_sample_step / costs.regen_s_per_sample_step
    return out


def gpu_check_note(gpu_check: Path | None) -> str:
    """Where the measured prices come from (bench.gpu_check's gpu_check.json), and a warning for tiny models."""
    path = None if gpu_check is None else gpu_check / "gpu_check.json"
    if path is None or not path.exists():
        return ""
    data = json.loads(path.read_text())
    note = f", {data.get('mode', '?')} models on {data.get('device_name', '?')}"
    return note + (": tiny models, not a price of the real ones" if data.get("mode") == "tiny" else "")


def break_even_table(runs: Runs, baseline: str, run: str, gpu_check: Path | None = None) -> tuple[str, dict]:
    """`break_even_q` per seed at each d of `D_SETTINGS`, beside the price table's own q at that d
    (`bench.prices.fp4_ratio_at`), the paper's 0.46, NVFP4's ideal 0.25 and a measured FP8 q where
    `gpu_check` holds costs files."""
    seeds = sorted(set(runs[baseline]) & set(runs[run]))
    out: dict[str, Any] = {"baseline": baseline, "run": run, "seeds": seeds, "by_d": {}}
    lines = [f"| decode + reward d (GPU-s/image) | c_b (GPU-s) | the table's q at this d | break-even q* "
             f"(`{run}` = `{baseline}` in modeled time to its final reward) | q* ÷ the table's q |",
             "|---|---|---|---|---|"]
    for label, d in D_SETTINGS:
        qs = [break_even_q(runs[baseline][s], runs[run][s], d) for s in seeds]
        table_q = fp4_ratio_at(d)
        out["by_d"][label] = {"d": d, "c_b": prices_at(d)["fp_pool_sample_steps"], "table_q": table_q,
                              "break_even_q": qs}
        lines.append(f"| {label}: {d:.4f} | {prices_at(d)['fp_pool_sample_steps']:.4f} | {table_q:.4f} | "
                     f"{logged(qs)} | {logged([q / table_q for q in qs], 2)} |")
    fp8 = measured_fp8_ratios(gpu_check) if gpu_check is not None else {}
    out["fp8_measured_q"] = fp8
    default = out["by_d"][D_SETTINGS[1][0]]
    q_star = finite_mean(default["break_even_q"])
    if not math.isfinite(q_star):
        verdict = f"`{run}` does not reach `{baseline}`'s final reward on any seed: no break-even price."
    elif q_star < 0:
        verdict = (f"q* < 0 at the default d: even free low-precision steps would leave `{run}` slower to "
                   f"`{baseline}`'s final reward (its regeneration, training and scoring alone cost more).")
    else:
        side = "below" if default["table_q"] < q_star else "above"
        verdict = (f"At the default d the table's q = {default['table_q']:.3f} is {side} the break-even "
                   f"q* = {q_star:.3f} (mean over seeds): `{run}` is {'faster' if side == 'below' else 'slower'} "
                   f"there; a low-precision step priced under q*·c_b makes it faster.")
    fp8_text = ("; ".join(f"{m} q = {q:.3f}" for m, q in fp8.items()) + " (bench.gpu_check's costs files"
                + gpu_check_note(gpu_check) + ")") if fp8 else \
        "not measured here (no bench/results/gpu_check/costs_<model>.json)"
    lines += ["", f"Reference q: the paper's Blackwell NVFP4 ≈ {PAPER_FP4_RATIO} (Table 5 at d = 0: "
              f"{fp4_ratio_at(D_LOW):.4f}); NVFP4's ideal {IDEAL_FP4_RATIO}; FP8 measured: {fp8_text}. "
              f"Seeds {seeds}. {verdict}"]
    return "\n".join(lines), out


# Adaptive exploration re-judged

def adaptive_table(runs: Runs, schemes: tuple[str, ...] = ADAPTIVE_RUNS, fixed: str = FIXED,
                   baseline: str = BASELINE) -> tuple[str, dict]:
    """Per scheme (and the fixed pass): final held-out reward; at each d of `D_SETTINGS`, the modeled time
    (the full price table at d, scored images included) to the baseline's final reward per seed, and its ratio
    to the fixed pass's on the same seed (< 1: faster). The verdict per scheme and d (`adaptive_verdict`)
    judges its mean time against the fixed pass's seed range over all the fixed pass's seeds."""
    out: dict[str, Any] = {"pending": missing(runs, (*schemes, fixed))}
    if baseline not in runs or fixed not in runs:
        return f"{PENDING}: needs `{baseline}` and `{fixed}`.", out
    priced = {label: repriced({n: runs[n] for n in (baseline, fixed, *schemes) if n in runs}, prices_at(d))
              for label, d in D_SETTINGS}
    fixed_seeds = sorted(set(runs[fixed]) & set(runs[baseline]))
    target = {s: runs[baseline][s][-1]["eval_reward"] for s in runs[baseline]}

    def times(name: str, seeds: list[int], label: str) -> list[float]:
        return [first_reach(priced[label][name][s], target[s], "modeled_s") for s in seeds]

    header = "| run | seeds | final held-out reward | " + " | ".join(
        f"time to {baseline}'s final reward, {label} (GPU-s) | ÷ fixed pass" for label, _ in D_SETTINGS) + " |"
    lines = [header, "|---" * (3 + 2 * len(D_SETTINGS)) + "|"]
    fixed_times = {label: times(fixed, fixed_seeds, label) for label, _ in D_SETTINGS}
    out[fixed] = {"seeds": fixed_seeds, "final": [runs[fixed][s][-1]["eval_reward"] for s in fixed_seeds],
                  "time_s": fixed_times}
    verdicts = []
    for name in (*schemes, fixed):
        if name not in runs:
            lines.append(f"| {name} | {PENDING} |" + " — |" * (1 + 2 * len(D_SETTINGS)))
            continue
        seeds = sorted(set(runs[name]) & set(runs[fixed]) & set(runs[baseline]))
        row = {"seeds": seeds, "final": [runs[name][s][-1]["eval_reward"] for s in seeds], "time_s": {},
               "ratio": {}, "verdict": {}}
        cells = []
        for label, _ in D_SETTINGS:
            t = times(name, seeds, label)
            f = dict(zip(fixed_seeds, fixed_times[label], strict=True))
            row["time_s"][label] = t
            row["ratio"][label] = [x / f[s] if math.isfinite(x) and math.isfinite(f[s]) else math.nan
                                   for x, s in zip(t, seeds, strict=True)]
            cells.append(f"{spread(t, 0)} | {logged(row['ratio'][label], 2)}")
            if name != fixed:
                row["verdict"][label] = adaptive_verdict(t, fixed_times[label])
        out[name] = row
        lines.append(f"| {name} | {len(seeds)} | {spread(row['final'])} | " + " | ".join(cells) + " |")
        if name != fixed:
            final_range = [v for v in out[fixed]["final"] if math.isfinite(v)]
            where = ("within" if min(final_range) <= np.mean(row["final"]) <= max(final_range) else
                     "above" if np.mean(row["final"]) > max(final_range) else "below")
            verdicts.append(f"- `{name}` ({len(seeds)} seeds; final reward {np.mean(row['final']):.3f}, {where} the "
                            f"fixed pass's range): " + "; ".join(f"{label}: {row['verdict'][label]}"
                                                                  for label, _ in D_SETTINGS) + ".")
    base_seeds = sorted(runs[baseline])
    own = {label: times(baseline, base_seeds, label) for label, _ in D_SETTINGS}
    lines.append(f"| {baseline} (the target is its final reward) | {len(base_seeds)} | — | "
                 + " | ".join(f"{spread(own[label], 0)} | —" for label, _ in D_SETTINGS) + " |")
    out[baseline] = {"seeds": base_seeds, "time_s": own}
    return ("\n".join(lines) + "\n\nVerdict (a scheme beats the fixed pass outside its seed spread when its mean time "
            "to the target is below the fixed pass's fastest seed):\n\n" + "\n".join(verdicts or ["- none yet"])
            + pending_note(runs, (*schemes, fixed))), out


def adaptive_verdict(times: list[float], fixed_times: list[float]) -> str:
    """"beats the fixed pass outside its seed spread" when mean(times) < min(fixed_times); "slower … outside"
    when above max(fixed_times); "within the fixed pass's seed spread" otherwise; a seed that never reaches
    the target is said first."""
    never = sum(not math.isfinite(t) for t in times)
    fixed = [t for t in fixed_times if math.isfinite(t)]
    if never:
        return f"never reaches the target on {never} of {len(times)} seeds"
    if not fixed:
        return "the fixed pass never reaches the target"
    mean = float(np.mean(times))
    if mean < min(fixed):
        return f"beats the fixed pass outside its seed spread ({mean:.0f} < {min(fixed):.0f} GPU-s)"
    if mean > max(fixed):
        return f"slower than the fixed pass outside its seed spread ({mean:.0f} > {max(fixed):.0f} GPU-s)"
    return f"within the fixed pass's seed spread ({min(fixed):.0f} ≤ {mean:.0f} ≤ {max(fixed):.0f} GPU-s)"


# Ablations and the measured benches

def ablation_table(runs: Runs, rows: dict[int, str], paper: dict[int, float], label: str) -> tuple[str, dict]:
    """Tables 2 and 3: per setting, the final held-out reward and the modeled time to diffusionnft's final
    reward (per seed; ∞: not reached)."""
    names = [rows[k] for k in rows if rows[k] in runs]
    seeds = seeds_of(runs, names)
    out: dict[str, Any] = {"seeds": seeds}
    lines = [f"| {label} | run | final held-out reward | modeled GPU time to diffusionnft's final reward (s) | "
             "paper (HPSv2) |", "|---|---|---|---|---|"]
    for key, name in rows.items():
        if name not in runs:
            lines.append(f"| {key} | {name} | {PENDING} | — | {paper[key]:.4f} |")
            continue
        final = [runs[name][s][-1]["eval_reward"] for s in seeds]
        reach = [first_reach(runs[name][s], runs[BASELINE][s][-1]["eval_reward"], "modeled_s") for s in seeds]
        out[name] = {"final": final, "time_to_target_s": reach}
        lines.append(f"| {key} | {name} | {spread(final)} | {spread(reach, 0)} | {paper[key]:.4f} |")
    own = [runs[BASELINE][s][-1]["modeled_s"] for s in seeds]
    out[BASELINE] = {"time_to_target_s": own}
    lines.append(f"| — | {BASELINE} (the target is its final reward) | — | {spread(own, 0)} | — |")
    return "\n".join(lines), out


def selection_section(results: Path) -> tuple[str, str]:
    """The tables of `bench.selection_stats` (the kept samples' true-reward gap per pool size N and the
    advantage distribution) from bench/results/selection_stats.json, formatted by that module; a note when
    the file is not there or does not match the module's format."""
    title = ("Selection statistics: the kept samples' true-reward gap and the advantages per pool size "
             "(bench.selection_stats)")
    path = results / "selection_stats.json"
    if not path.exists():
        return title, ("Not measured yet: `python -m bench.selection_stats --prompts 24 --set "
                       "\"reward.weights={digit_margin: 1.0}\" --json bench/results/selection_stats.json` writes it.")
    data = json.loads(path.read_text())
    try:
        from bench import selection_stats

        text = selection_stats.format_tables(data)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as exc:
        return title, (f"bench/results/selection_stats.json does not match bench.selection_stats' format ({exc!r}): "
                       "rerun it.")
    prompts = len(data.get("per_prompt", [])) or data.get("args", {}).get("prompts", "?")
    return title, f"{prompts} prompts; explore {data.get('explore', {})}.\n\n{text}"


def measured_tables(results: Path) -> list[tuple[str, str]]:
    """The tables of the selection benches, where their JSON exists (they are not training runs)."""
    sections = [selection_section(results)]
    fidelity_json = results / "rank_fidelity_margin.json"
    if fidelity_json.exists():
        sections.append(("Table 8: rank fidelity on `digit_margin` (bench.rank_fidelity)",
                         rank_fidelity.format_table(json.loads(fidelity_json.read_text()))))
    adaptive_json = results / "adaptive_explore.json"
    if adaptive_json.exists():
        data = json.loads(adaptive_json.read_text())
        sections.append((f"Adaptive exploration: selection of the best and worst {data['keep'] // 2} against "
                         f"full precision (bench.adaptive_explore, {data['args']['prompts']} prompts)",
                         adaptive_explore.format_table(data["results"], data["fixed_steps"])))
    return sections


def moved_table(runs: Runs, previous: Runs, change: str = PREVIOUS_CHANGE) -> tuple[str, dict]:
    """What a change of defaults moved: per run present in both sets, on the seeds both have, the final
    held-out reward and the speedup to each set's own `BASELINE` final reward (iterations, modeled GPU time),
    before → now, and the change of the mean final reward."""
    names = [n for n in dict.fromkeys([*CONVERGENCE_RUNS, *GRPO_VARIANTS, *LONG_RUNS, *EXPLORE_RUNS.values(),
                                       *POOL_RUNS.values()]) if n in runs and n in previous]
    baselines = {n: LONG_BASELINE if n in LONG_RUNS else BASELINE for n in names}
    lines = [f"Before: {change.split(' → ')[0]}; now: {change.split(' → ')[-1]}. Runs of both sets, on the "
             "seeds both have (a run not yet re-made is not listed).", "",
             "| run | seeds | final held-out reward, before | now | now − before (mean) | speedup to the baseline's "
             "final, iterations, before | now | modeled GPU time, before | now |",
             "|---|---|---|---|---|---|---|---|---|"]
    out: dict[str, Any] = {}
    for name in names:
        base = baselines[name]
        seeds = [s for s in runs[name]
                 if s in previous[name] and s in runs.get(base, {}) and s in previous.get(base, {})]
        if not seeds:
            continue
        rows = {}
        for label, source in (("before", previous), ("now", runs)):
            subset = {n: {s: source[n][s] for s in seeds} for n in dict.fromkeys([base, name])}
            row = speedups(subset, base)[name]
            rows[label] = {"final": row["final_eval_reward"], "iteration": never_as_nan(row["iteration"]["per_seed"]),
                           "modeled_s": never_as_nan(row["modeled_s"]["per_seed"])}
        delta = finite_mean(rows["now"]["final"]) - finite_mean(rows["before"]["final"])
        out[name] = {"seeds": seeds, **rows, "delta_final": delta}
        lines.append(f"| {name} | {seeds} | {spread(rows['before']['final'])} | {spread(rows['now']['final'])} | "
                     f"{delta:+.3f} | {spread(rows['before']['iteration'], 2)} | {spread(rows['now']['iteration'], 2)} "
                     f"| {spread(rows['before']['modeled_s'], 2)} | {spread(rows['now']['modeled_s'], 2)} |")
    return "\n".join(lines), out


def shared_runs(runs: Runs, previous: Runs) -> tuple[Runs, Runs]:
    """Both sets cut to the (run, seed) pairs both hold, so a number computed on each compares like with like."""
    names = [n for n in runs if n in previous]
    cut = {n: sorted(set(runs[n]) & set(previous[n])) for n in names}
    return ({n: {s: runs[n][s] for s in cut[n]} for n in names if cut[n]},
            {n: {s: previous[n][s] for s in cut[n]} for n in names if cut[n]})


def headline_numbers(runs: Runs) -> dict[str, float]:
    """The numbers the report's conclusions rest on, by label: Table 1's rewards at equal modeled time, the
    break-even q* at the default d (the pool pair's), and each ART reading's final reward, max drift_kl and
    deepest accuracy drop (means over seeds); a number whose runs are absent is left out."""
    out: dict[str, float] = {}
    if BASELINE in runs:
        table1 = equal_time_table(runs)[1]
        for name, rewards in table1["reward"].items():
            out[f"Table 1, {name} at equal modeled time"] = finite_mean(rewards)
    pair = pool_pair(runs)
    if pair is not None:
        baseline, run, _ = pair
        by_d = break_even_table(runs, baseline, run)[1]["by_d"][D_SETTINGS[1][0]]
        out[f"break-even q* at the default d (`{run}` against `{baseline}`)"] = finite_mean(by_d["break_even_q"])
    art = art_table(runs)[1]
    for reading in ART_READINGS:
        if reading in art:
            out[f"{reading}: final held-out reward"] = finite_mean(art[reading]["final_reward"])
            out[f"{reading}: max drift_kl"] = finite_mean(art[reading]["drift_kl_max"])
            out[f"{reading}: deepest accuracy drop"] = finite_mean(art[reading]["dip_drop"])
    return out


def moved_headlines(runs: Runs, previous: Runs) -> tuple[str, dict]:
    """`headline_numbers` of both sets on the (run, seed) pairs they share, before → now."""
    now, before = (headline_numbers(r) for r in shared_runs(runs, previous))
    labels = [k for k in now if k in before]
    lines = ["| number (means over the seeds both sets have) | before | now |", "|---|---|---|"]
    lines += [f"| {k} | {before[k]:.4f} | {now[k]:.4f} |" for k in labels]
    return "\n".join(lines), {k: {"before": before[k], "now": now[k]} for k in labels}


def expected_runs() -> list[tuple[str, int]]:
    """Every (run, seed) the report's sections expect: the suite's PLAN and 3 seeds of each adaptive schedule."""
    expected = list(PLAN) + [(n, s) for n in ADAPTIVE_RUNS for s in EXPECTED_SEEDS]
    return list(dict.fromkeys(expected))


def inventory(runs: Runs) -> str:
    lines = [f"- `{n}`: seeds {sorted(by_seed)}" for n, by_seed in sorted(runs.items())]
    absent = [(n, s) for n, s in expected_runs() if s not in runs.get(n, {})]
    if absent:
        lines += ["", "Pending (expected, no file yet): " + ", ".join(f"`{n}` seed {s}" for n, s in absent) + "."]
    return "\n".join(lines)


def splice(doc: Path, body: str, begin: str = "<!-- evidence:begin -->", end: str = "<!-- evidence:end -->") -> None:
    """Replace what lies between the markers of `doc` by `body` (the tables in docs/benchmarks.md are
    these generated ones, so the two files cannot disagree)."""
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{doc} lacks the markers {begin} … {end} that say where the tables go")
    head, rest = text.split(begin, 1)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")


def sections_of(runs: Runs, results: Path, previous: Runs | None = None) -> tuple[list[tuple[str, str]], dict,
                                                                                  dict | None]:
    """Every section (title, markdown), the numbers of each, and the pool-pays table for the figure;
    with `previous` (the evidence before a change of defaults) a section on what moved."""
    sections, numbers = [], {}
    text, numbers["convergence"] = convergence_table(runs)
    sections.append(("Convergence (the paper's Figure/Table 6 protocol): speedup to diffusionnft's final "
                     "held-out reward", text + f"\n\n{PAPER_CONVERGENCE}" + pending_note(runs, CONVERGENCE_RUNS)))
    if LONG_BASELINE in runs:
        text, numbers["convergence_long"] = convergence_table(runs, LONG_RUNS, LONG_BASELINE)
    else:
        text, numbers["convergence_long"] = "\n".join(f"| {n} | {PENDING} |" for n in LONG_RUNS), {}
        text = "| run | seeds |\n|---|---|\n" + text
    sections.append((f"Convergence of the long pair (against {LONG_BASELINE})",
                     text + pending_note(runs, LONG_RUNS)))
    text, numbers["table1"] = equal_time_table(runs)
    grpo_text, numbers["flow_grpo_update"] = grpo_objective_table(runs)
    variant_texts = []
    for variant, key in (("flow_grpo_cfg1", "flow_grpo_cfg"), ("flow_grpo_ema_every1", "flow_grpo_ema")):
        variant_text, numbers[key] = grpo_variant_note(runs, variant)
        variant_texts.append(variant_text)
    sections.append(("Table 1: held-out reward at equal modeled GPU time, and Flow-GRPO's clip",
                     "\n\n".join([text, FLOW_GRPO_CFG_NOTE, grpo_text, *variant_texts])))
    pair, speed = pool_pair(runs), None
    if pair is None:
        sections.append(("Where the pool pays", f"{PENDING}: needs `{BASELINE}` and `{FIXED}` (or the long pair)."))
        sections.append(("Break-even price of a low-precision step", f"{PENDING}."))
    else:
        baseline, run, note = pair
        text, speed = pool_pays_table(runs, baseline, run)
        numbers["pool_pays"] = speed
        sections.append((f"Where the pool pays: `{run}` against `{baseline}`",
                         f"{note} Figure: `bench/results/evidence_speedup.png`.\n\n{text}"))
        text, numbers["break_even"] = break_even_table(runs, baseline, run, results / "gpu_check")
        sections.append(("Break-even price of a low-precision step (q: its price ÷ the full-precision pool "
                         "step's c_b)", f"{note}\n\n{text}"))
    text, numbers["pool_pays_art"], numbers["break_even_art"] = art_pool_section(runs, results / "gpu_check")
    sections.append((f"Where the pool pays under DiffusionART: `{ART_READINGS[1]}` against `{ART_BASELINE}`", text))
    text, numbers["adaptive"] = adaptive_table(runs)
    sections.append(("Adaptive exploration re-judged: time to diffusionnft's final reward at each decode + "
                     "reward price", text))
    text, numbers["art"] = art_table(runs)
    sections.append(("DiffusionART: the two readings of the trust mask", text))
    text, numbers["table2"] = ablation_table(runs, EXPLORE_RUNS, PAPER_TABLE_2, "explore steps")
    sections.append(("Table 2: explore steps (N = 96, K = 24)", text))
    text, numbers["table3"] = ablation_table(runs, POOL_RUNS, PAPER_TABLE_3, "pool N")
    sections.append(("Table 3: pool size (K = 24, 6 explore steps)", text))
    sections += measured_tables(results)
    if previous:
        text, numbers["moved"] = moved_table(runs, previous)
        headlines, numbers["moved_headlines"] = moved_headlines(runs, previous)
        sections.append(("What moved from the previous evidence", f"{text}\n\n{headlines}"))
    sections.append(("Runs in this report", inventory(runs)))
    return sections, numbers, speed


def report(run_dir: Path, results: Path, doc: Path = Path("docs/evidence.md"),
           discussion: Path | None = Path("docs/benchmarks.md"), previous_dir: Path | None = None) -> None:
    """The report of the runs in `run_dir` (see the module docstring); with `previous_dir` (the suite passes
    `PREVIOUS_RUN_DIR`), a section on what the change of defaults between the two sets moved."""
    runs = load_all(run_dir)
    results.mkdir(parents=True, exist_ok=True)
    if BASELINE not in runs:
        raise SystemExit(f"no {BASELINE} run in {run_dir}: it sets every table's target")
    previous = {PREVIOUS_NAMES.get(n, n): by_seed for n, by_seed in load_all(previous_dir).items()} \
        if previous_dir is not None and previous_dir.is_dir() else None
    sections, numbers, speed = sections_of(runs, results, previous)
    body = "\n\n".join(f"## {title}\n\n{text}" for title, text in sections)
    if discussion is not None:
        splice(discussion, "\n\n".join(f"#### {title}\n\n{text}" for title, text in sections[:-1]))
    doc.write_text("# Evidence on the embedded world (generated)\n\nWritten by `python -m bench.evidence "
                   "--report` from `bench/results/runs/*.json`; do not edit by hand. Cells: mean (min–max) "
                   "[per seed]. Modeled GPU time: `bench.prices` (the paper's SD3.5-L Table 5, each scored image "
                   "at the default decode + reward price d unless a table says otherwise). The discussion is in "
                   "[benchmarks.md](benchmarks.md).\n\n" + body + "\n")
    print(body)
    for group, names in FIGURES.items():
        baseline = FIGURE_BASELINES.get(group, BASELINE)
        seeds = seeds_of(runs, [m for m in names if m in runs], baseline)
        subset = {n: {s: runs[n][s] for s in seeds} for n in names if n in runs}
        if len(subset) > 1 and seeds:
            plot(subset, results / f"evidence_{group}.png", ylabel="held-out digit_margin")
        else:  # no figure from runs that are not there: an earlier report's would show other runs
            (results / f"evidence_{group}.png").unlink(missing_ok=True)
    if speed is not None and speed["seeds"]:
        plot_speedup(speed, results / "evidence_speedup.png")
    (results / "evidence.json").write_text(json.dumps({"tables": numbers, "runs": runs}, indent=1, default=str) + "\n")
    print(f"wrote {doc}, {results / 'evidence.json'} and the figures")
