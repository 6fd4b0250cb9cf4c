"""Adaptive exploration: how well successive halving selects, for how much exploration, against the
paper's fixed pass (every candidate, every explore step).

    python -m bench.adaptive_explore [--config FILE] [--set k=v ...] [--prompts 24] [--n 96]
        [--schedules 6,1:48,2:48,2:36,3:48] --json FILE

For P prompts × N seeds of the base model: the truth is every seed sampled in full precision at the
sampler's steps and scored; each schedule ranks the same seeds with the low-precision engine ("6": the
fixed pass at 6 steps; "f:M": successive halving, `learner.rollouts.successive_halving`) and selects
best_worst K. Per schedule, averaged over prompts:
    precision  |selected ∩ truth's best_worst K| / K
    contrast   (true mean of the selected top half − of the selected bottom half) ÷ the truth's own:
               how much of the achievable best–worst gap the selection delivers (1: all of it)
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
from learner.rollouts import exploration_sampling, explore_group, generate, regeneration_sampling
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

    return {"precision": len(set(selected) & set(best)) / keep, "contrast": gap(selected) / gap(best)}


def format_table(results: dict[str, dict[str, float]], fixed_steps: float) -> str:
    """One row per schedule: precision, contrast, and its low-precision steps against the fixed pass's."""
    lines = ["| schedule | precision | contrast | low-precision steps per prompt | ÷ fixed pass |",
             "|---|---|---|---|---|"]
    for schedule, r in results.items():
        first, _, survivors = schedule.partition(":")
        label = f"fixed, {first} steps" if not survivors else f"halving: all {first} steps, {survivors} finish"
        lines.append(f"| {label} | {r['precision']:.3f} | {r['contrast']:.3f} | {r['steps']:.0f} | "
                     f"{r['steps'] / fixed_steps:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--schedules", type=lambda s: s.split(","), default=["6", "1:48", "2:48", "2:36", "3:48"])
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
    fixed = exploration_sampling(config)
    samplings = {}
    for schedule in args.schedules:
        first, _, survivors = schedule.partition(":")
        samplings[schedule] = replace(fixed, steps=int(first)) if not survivors else replace(
            fixed, halving=(int(first), int(survivors)))
    bad = [s for s, sm in samplings.items() if sm.halving and not (sm.halving[0] < fixed.steps
                                                                    and keep <= sm.halving[1] <= args.n)]
    if bad:
        parser.error(f"--schedules {', '.join(bad)}: f:M needs f < {fixed.steps} explore steps and "
                     f"{keep} <= M <= {args.n}")

    rows: dict[str, list[dict[str, float]]] = {s: [] for s in samplings}
    for slot, prompt in enumerate(prompts):
        seeds = candidate_seeds(config.run.seed, 0, slot, args.n)
        meta = prompt_set.metadata_of(prompt)[0]
        truth_rewards = generate(policy, None, reward, prompt, seeds, regeneration_sampling(config),
                                 metadata=meta).rewards
        truth = dict(zip(seeds, truth_rewards.tolist(), strict=True))
        for schedule, sampling in samplings.items():
            group = explore_group(policy, engine, reward, iteration=0, slot=slot, prompt=prompt, seeds=seeds,
                                  sampling=sampling, policy_version=0, metadata=meta)
            chosen = [group.seeds[i] for i in select_candidates(group.proxy, keep).tolist()]
            rows[schedule].append({**selection_quality(chosen, truth, keep), "steps": sampling.pool_steps(args.n)})
        print(f"prompt {slot + 1}/{len(prompts)}", flush=True)

    results = {s: {k: float(np.mean([r[k] for r in rs])) for k in rs[0]} for s, rs in rows.items()}
    print(format_table(results, fixed.pool_steps(args.n)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "keep": keep,
                                     "fixed_steps": fixed.pool_steps(args.n), "results": results,
                                     "per_prompt": rows}, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
