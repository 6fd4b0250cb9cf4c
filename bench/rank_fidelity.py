"""Rank fidelity of low-precision exploration (the paper's Table 8) on any model.

    python -m bench.rank_fidelity [--config FILE] [--prompts P] [--n 96] [--explore-steps 6]
                                  [--train-steps 10] [--precisions nvfp4,nvfp4_w4a16,fp8] --json FILE

For P prompts × N seeds: the reference is full precision at train steps (what the learner
regenerates); each variant samples the same seeds at explore steps — full precision
(`none_explore_steps`, the step effect alone) and every low precision (step + quantization effect).
Per prompt it compares the variant's rewards with the reference's: Spearman ρ, Kendall τ, top-K and
bottom-K hit rates (|top-K(variant) ∩ top-K(reference)| / K), then averages over prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from cluster.config import SolRLConfig, load_config
from diffusion.explore import build_explore_engine
from diffusion.loading import load_policy_from_config
from diffusion.noise import derive_seeds
from diffusion.policy import FlowPolicy
from diffusion.prompts import load_prompts
from learner.fidelity import fidelity
from rewards import Reward, build_reward_from_config

PAPER_NVFP4 = {"spearman": 0.927, "kendall": 0.798, "hit@4": 0.969, "hit@8": 0.950, "hit@12": 0.933}


def reference_margin(reference: np.ndarray, k: int = 12) -> float:
    """Median over prompts of the reference reward gap between ranks k and k+1 — how close a swap is."""
    ordered = -np.sort(-reference, axis=1)
    return float(np.median(ordered[:, k - 1] - ordered[:, k]))


def sample_rewards(policy, reward, prompts, n, run_seed, steps, solver, transformer=None):
    """Rewards [P, N] of each prompt's N derived seeds, and seconds spent."""
    # One untimed call first: the first forward of a model pays allocation and kernel warm-up.
    policy.sample([prompts[0]] * n, list(range(n)), steps=2, solver=solver, transformer=transformer)
    rewards = []
    start = time.perf_counter()
    for slot, prompt in enumerate(prompts):
        seeds = derive_seeds(run_seed, 0, slot, n)
        latents = policy.sample([prompt] * n, seeds, steps=steps, solver=solver, transformer=transformer).x0
        rewards.append(reward(policy.decode(latents), [prompt] * n).numpy())
    return np.stack(rewards), time.perf_counter() - start


def measure(
    config: SolRLConfig,
    policy: FlowPolicy,
    reward: Reward,
    num_prompts: int,
    n: int,
    explore_steps: int,
    train_steps: int,
    precisions: list[str],
) -> dict[str, dict[str, float]]:
    """Reference rewards at full precision × train_steps, then each variant's Table-8 metrics."""
    prompts = load_prompts(config.prompts.source)
    if num_prompts > len(prompts):
        raise ValueError(f"asked for {num_prompts} prompts but {config.prompts.source!r} has {len(prompts)}")
    prompts = prompts[:num_prompts]
    seed, candidates = config.run.seed, num_prompts * n
    reference, ref_seconds = sample_rewards(policy, reward, prompts, n, seed, train_steps, config.sampler.solver)
    results: dict[str, dict[str, float]] = {
        "reference": {"s_per_candidate": ref_seconds / candidates, "steps": train_steps,
                      "mean_reward": float(reference.mean()), "margin@12": reference_margin(reference),
                      "saturated_fraction": float((reference > -0.01).mean())}
    }
    for name, precision in [("none_explore_steps", "none")] + [(p, p) for p in precisions]:
        engine = None
        if precision != "none":
            engine = build_explore_engine(policy, config.explore.model_copy(update={"precision": precision}))
        proxy, seconds = sample_rewards(
            policy, reward, prompts, n, seed, explore_steps, config.explore.solver, transformer=engine
        )
        results[name] = {**fidelity(proxy, reference), "s_per_candidate": seconds / candidates,
                         "steps": explore_steps, "mean_reward": float(proxy.mean())}
    return results


def format_table(results: dict[str, dict[str, float]]) -> str:
    cols = ("spearman", "kendall", "hit@4", "hit@8", "hit@12", "bottom_hit@12", "tolerant_hit@12", "s_per_candidate")
    lines = [f"| variant | steps | {' | '.join(cols)} |", "|---" * (len(cols) + 2) + "|"]
    for name, row in results.items():
        if name == "reference":
            continue
        cells = [f"{row[c]:.4f}" if c == "s_per_candidate" else f"{row[c]:.3f}" for c in cols]
        lines.append(f"| {name} | {row['steps']} | {' | '.join(cells)} |")
    paper = [f"{PAPER_NVFP4[c]:.3f}" if c in PAPER_NVFP4 else "—" for c in cols]
    lines.append(f"| paper NVFP4 (Table 8) | 6 vs 10 | {' | '.join(paper)} |")
    ref = results["reference"]
    lines.append(f"\nreference: full precision, {ref['steps']} steps, {ref['s_per_candidate']:.4f} s/candidate, "
                 f"mean reward {ref['mean_reward']:.3f}, median reward gap between ranks 12 and 13: "
                 f"{ref['margin@12']:.4f}; candidates with log p > -0.01 (saturated): "
                 f"{ref['saturated_fraction']:.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--n", type=int, default=96)
    parser.add_argument("--explore-steps", type=int, default=6)
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["nvfp4", "nvfp4_w4a16", "fp8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n < 13:
        parser.error("--n must be at least 13 (hit@12 needs more candidates than 12)")
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.set)
    policy = load_policy_from_config(config.model)
    reward = build_reward_from_config(config.reward)
    results = measure(config, policy, reward, args.prompts, args.n, args.explore_steps, args.train_steps,
                      args.precisions)
    print(format_table(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
