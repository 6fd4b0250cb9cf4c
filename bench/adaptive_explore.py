"""Adaptive exploration: how well successive halving and the spread schedule select, for how much
exploration, against the paper's fixed pass (every candidate, every explore step).

    python -m bench.adaptive_explore [--config FILE] [--set k=v ...] [--prompts 24] [--n 96]
        [--schedules 6,1:48,2:48,2:36,3:48,spread:36,spread:48,proportional:48,pool:72] --json FILE

For P prompts × N seeds of the base model: the truth is every seed sampled in full precision at the
sampler's steps and scored; each schedule ranks the same seeds with the low-precision engine and selects
best_worst K:
    "6"         the fixed pass at 6 steps
    "f:M"       successive halving, `learner.rollouts.successive_halving`: all f steps, M finish
    "spread:F"  the spread schedule, `learner.rollouts.spread_explore`: the first F seeds of every prompt,
                all N where the std of those F proxies reaches the reference — here the median over the
                bench's prompts, which stand for the previous iteration's slots (a pool is a prefix of the
                candidate list, so it is the N-seed pass cut to its size: the same proxies)
    "proportional:F"  the same with `explore.spread_rule=proportional`: (F + N)/2 · std ÷ the median seeds,
                within [F, N]
    "pool:M"    the fixed pass over the first M seeds only: a uniform pool of the same cost, the control
                that says whether placing the seeds by spread buys anything
Per schedule, averaged over prompts:
    precision  |selected ∩ truth's best_worst K| / K
    contrast   (true mean of the selected top half − of the selected bottom half) ÷ the truth's own:
               how much of the achievable best–worst gap the selection delivers (1: all of it)
    gap        that true gap itself, in reward units: what the update's advantages see (centred per
               prompt, scaled by one std over the batch), where a wide prompt's gap counts for more
    steps      low-precision sample-steps per prompt, and that ÷ the fixed pass's
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from cluster.config.loading import load_config
from diffusion.explore import ExploreEngine
from diffusion.loading import load_policy_from_config
from diffusion.noise import candidate_seeds
from diffusion.prompts import load_prompt_set
from learner.rollouts import (
    Sampling,
    exploration_sampling,
    explore_group,
    generate,
    regeneration_sampling,
    spread_pool_size,
    spread_reference,
)
from learner.selection import select_candidates
from rewards import build_reward_from_config


def selection_quality(selected: list[int], truth: dict[int, float], keep: int) -> dict[str, float]:
    """Precision and contrast of `selected` seeds (top half first, then bottom half) against the true
    rewards of every seed of the prompt."""
    seeds = list(truth)
    true = torch.tensor([truth[s] for s in seeds])
    best = [seeds[i] for i in select_candidates(true, keep).tolist()]
    half = keep // 2

    def gap(chosen: list[int]) -> float:
        return float(np.mean([truth[s] for s in chosen[:half]]) - np.mean([truth[s] for s in chosen[half:]]))

    return {"precision": len(set(selected) & set(best)) / keep, "contrast": gap(selected) / gap(best),
            "gap": gap(selected)}


def schedule_label(schedule: str) -> str:
    kind, _, value = schedule.partition(":")
    if kind == "spread":
        return f"spread: {value} for all, the rest where their std ≥ the median"
    if kind == "proportional":
        return f"spread: {value} for all, up to all in proportion to their std"
    if kind == "pool":
        return f"fixed, first {value} seeds only"
    return f"fixed, {kind} steps" if not value else f"halving: all {kind} steps, {value} finish"


def format_table(results: dict[str, dict[str, float]], fixed_steps: float) -> str:
    """One row per schedule: precision, contrast, the selected gap (when measured: older results have
    none), and its low-precision steps against the fixed pass's."""
    lines = ["| schedule | precision | contrast | selected gap (reward) | low-precision steps per prompt | "
             "÷ fixed pass |", "|---|---|---|---|---|---|"]
    for schedule, r in results.items():
        gap = f"{r['gap']:.3f}" if "gap" in r else "—"
        lines.append(f"| {schedule_label(schedule)} | {r['precision']:.3f} | {r['contrast']:.3f} | {gap} | "
                     f"{r['steps']:.0f} | {r['steps'] / fixed_steps:.2f} |")
    return "\n".join(lines)


def parse_schedule(schedule: str, fixed: Sampling, keep: int, n: int) -> tuple[Sampling, int] | str:
    """A schedule's sampling and how many of the N seeds it is given; or why it cannot run."""
    kind, _, value = schedule.partition(":")
    if kind in ("spread", "proportional"):
        first, rule = int(value), "median" if kind == "spread" else kind
        return (replace(fixed, spread=first, spread_rule=rule), n) if keep <= first < n else \
            f"{kind}:F needs {keep} <= F < {n}"
    if kind == "pool":
        return (fixed, int(value)) if keep <= int(value) <= n else f"pool:M needs {keep} <= M <= {n}"
    if not value:
        return replace(fixed, steps=int(kind)), n
    first, survivors = int(kind), int(value)
    if not (first < fixed.steps and keep <= survivors <= n):
        return f"f:M needs f < {fixed.steps} explore steps and {keep} <= M <= {n}"
    return replace(fixed, halving=(first, survivors)), n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--schedules", type=lambda s: s.split(","),
                        default=["6", "1:48", "2:48", "2:36", "3:48", "spread:36", "spread:48", "proportional:48",
                                 "pool:72"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(args.config, [*args.set, f"prompts.candidates={args.n}"])
    keep = config.prompts.keep
    policy = load_policy_from_config(config.model)
    reward = build_reward_from_config(config.reward)
    engine = ExploreEngine(policy, config.explore).module
    prompt_set = load_prompt_set(config.prompts.source)
    prompts = prompt_set.texts[: args.prompts]
    fixed = replace(exploration_sampling(config), halving=None, spread=None)
    parsed = {s: parse_schedule(s, fixed, keep, args.n) for s in args.schedules}
    bad = [f"{s} ({why})" for s, why in parsed.items() if isinstance(why, str)]
    if bad:
        parser.error(f"--schedules {', '.join(bad)}")

    rows: dict[str, list[dict[str, float]]] = {s: [] for s in parsed}
    spread: dict[str, list] = {s: [] for s, (sampling, _) in parsed.items() if sampling.spread is not None}
    for slot, prompt in enumerate(prompts):
        seeds = candidate_seeds(config.run.seed, 0, slot, args.n)
        meta = prompt_set.metadata_of(prompt)[0]
        truth_rewards = generate(policy, None, reward, prompt, seeds, regeneration_sampling(config),
                                 metadata=meta).rewards
        truth = dict(zip(seeds, truth_rewards.tolist(), strict=True))
        chunked = {}  # a spread schedule's pass (first chunk, then the rest), shared by its two rules
        for schedule, (sampling, given) in parsed.items():
            if schedule in spread:  # every seed explored here (no reference: a pool that took N), cut below
                if sampling.spread not in chunked:
                    chunked[sampling.spread] = explore_group(policy, engine, reward, iteration=0, slot=slot,
                                                             prompt=prompt, seeds=seeds, sampling=sampling,
                                                             policy_version=0, metadata=meta)
                spread[schedule].append((chunked[sampling.spread], truth))
                continue
            group = explore_group(policy, engine, reward, iteration=0, slot=slot, prompt=prompt, seeds=seeds[:given],
                                  sampling=sampling, policy_version=0, metadata=meta)
            chosen = [group.seeds[i] for i in select_candidates(group.proxy, keep).tolist()]
            rows[schedule].append({**selection_quality(chosen, truth, keep), "steps": sampling.pool_steps(given)})
        print(f"prompt {slot + 1}/{len(prompts)}", flush=True)
    for schedule, explored in spread.items():  # the rule, once every prompt's first chunk is known
        sampling = parsed[schedule][0]
        reference = spread_reference(group.first_spread for group, _ in explored)
        for group, truth in explored:
            size = spread_pool_size(group.first_spread, reference, sampling.spread, args.n, sampling.spread_rule)
            chosen = [group.seeds[i] for i in select_candidates(group.proxy[:size], keep).tolist()]
            rows[schedule].append({**selection_quality(chosen, truth, keep), "steps": sampling.pool_steps(size),
                                   "pool": size, "first_spread": group.first_spread, "reference": reference})

    averaged = ("precision", "contrast", "gap", "steps", "pool")  # pool: a spread schedule's mean pool size
    results = {s: {k: float(np.mean([r[k] for r in rs])) for k in averaged if k in rs[0]} for s, rs in rows.items()}
    print(format_table(results, fixed.pool_steps(args.n)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "keep": keep,
                                     "fixed_steps": fixed.pool_steps(args.n), "results": results,
                                     "per_prompt": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
