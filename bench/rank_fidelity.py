"""Rank fidelity of low-precision exploration (the paper's Table 8) on any model.

    python -m bench.rank_fidelity [--config FILE] [--prompts P] [--n 96] [--explore-steps 6]
                                  [--train-steps 10] [--precisions nvfp4,nvfp4_w4a16,fp8,fp8:torchao] --json FILE

For P prompts × N seeds: the reference is full precision at train steps (what the learner
regenerates); each variant samples the same seeds at explore steps — full precision
(`none_explore_steps`, the step effect alone) and every low precision (step + quantization effect).
Per prompt it compares the variant's rewards with the reference's: Spearman ρ, Kendall τ, top-K and
bottom-K hit rates (|top-K(variant) ∩ top-K(reference)| / K; `learner.fidelity`), then averages over
prompts. A precision may name its backend (``fp8:torchao``: the real FP8 engine, torchao's E4M3 GEMMs, run on
the CPU by its reference kernel; the others run the configured backend, the project's fake quantization on a
CPU). With several rewards configured, each one's ranking is measured too (the paper reports ρ per
reward), from the one set of samples. `bench.demo` prints a short version first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from cluster.config.loading import load_config
from cluster.config.preflight import check_inputs
from diffusion.explore import ExploreEngine
from diffusion.loading import load_policy_from_config
from diffusion.noise import candidate_seeds
from diffusion.policy import FlowPolicy
from diffusion.prompts import load_prompt_set
from diffusion.quant import QUANTIZED_PRECISIONS
from learner.config import TrainerConfig
from learner.fidelity import fidelity
from learner.rollouts import Sampling, exploration_sampling, generate, regeneration_sampling
from rewards import Reward, build_reward_from_config

PAPER_NVFP4 = {"spearman": 0.927, "kendall": 0.798, "hit@4": 0.969, "hit@8": 0.950, "hit@12": 0.933}
PAPER_SPEARMAN_PER_REWARD = {"clipscore": 0.900, "hpsv2": 0.943, "imagereward": 0.932, "pickscore": 0.934}


def reference_margin(reference: np.ndarray, k: int = 12) -> float:
    """Median over prompts of the reference reward gap between ranks k and k+1 — how close a swap is."""
    ordered = -np.sort(-reference, axis=1)
    return float(np.median(ordered[:, k - 1] - ordered[:, k]))


def sample_rewards(policy, reward, prompts, n, run_seed, sampling: Sampling, transformer=None, *,
                   components: tuple[str, ...] = (), prompt_set=None):
    """Rewards [P, N] of each prompt's N derived seeds, each named component's [P, N] (read from the
    weighted sum's details), and seconds spent."""
    # One untimed call first: the first forward of a model pays allocation and kernel warm-up.
    generate(policy, transformer, None, prompts[0], list(range(n)), dataclasses.replace(sampling, steps=2))
    rewards, component_rewards = [], {name: [] for name in components}
    start = time.perf_counter()
    for slot, prompt in enumerate(prompts):
        out = generate(policy, transformer, reward, prompt, candidate_seeds(run_seed, 0, slot, n), sampling,
                       metadata=prompt_set.metadata_of(prompt) if prompt_set is not None else None)
        rewards.append(out.rewards.numpy())
        for name in components:
            component_rewards[name].append(out.details[name].numpy())
    seconds = time.perf_counter() - start
    return np.stack(rewards), {k: np.stack(v) for k, v in component_rewards.items()}, seconds


def measure(
    config: TrainerConfig,
    policy: FlowPolicy,
    reward: Reward,
    num_prompts: int,
    n: int,
    explore_steps: int,
    train_steps: int,
    precisions: list[str],
) -> dict[str, dict[str, float]]:
    """Reference rewards at full precision × train_steps, then each variant's Table-8 metrics (and, with
    several rewards configured, each reward's under `per_reward`). Both sample as the run would: the
    learner's regeneration settings and the explorers' (`learner.rollouts`), at the steps given."""
    prompt_set = load_prompt_set(config.prompts.source)
    prompts = prompt_set.texts
    if num_prompts > len(prompts):
        raise ValueError(f"asked for {num_prompts} prompts but {config.prompts.source!r} has {len(prompts)}")
    prompts = prompts[:num_prompts]
    seed, candidates = config.run.seed, num_prompts * n
    components = tuple(config.reward.weights) if len(config.reward.weights) > 1 else ()
    reference, reference_components, reference_seconds = sample_rewards(
        policy, reward, prompts, n, seed, dataclasses.replace(regeneration_sampling(config), steps=train_steps),
        components=components, prompt_set=prompt_set)
    results: dict[str, dict[str, float]] = {
        "reference": {"s_per_candidate": reference_seconds / candidates, "steps": train_steps,
                      "mean_reward": float(reference.mean()), "margin@12": reference_margin(reference),
                      "saturated_fraction": float((reference > -0.01).mean())}
    }
    explore = dataclasses.replace(exploration_sampling(config), steps=explore_steps)
    for variant in ["none", *precisions]:
        precision, _, backend = variant.partition(":")
        name = "none_explore_steps" if variant == "none" else variant.replace(":", "_")
        engine = None
        if precision != "none":
            # An explicit format on purpose: this measures fidelity, so emulation is what is asked for.
            study = config.explore.model_copy(update={"precision": precision, "allow_emulation": True,
                                                      "backend": backend or config.explore.backend})
            engine = ExploreEngine(policy, study).module
        proxy, proxy_components, seconds = sample_rewards(policy, reward, prompts, n, seed, explore,
                                                          transformer=engine, components=components,
                                                          prompt_set=prompt_set)
        results[name] = {**fidelity(proxy, reference), "s_per_candidate": seconds / candidates,
                         "steps": explore_steps, "mean_reward": float(proxy.mean())}
        if components:
            results[name]["per_reward"] = {c: fidelity(proxy_components[c], reference_components[c])
                                           for c in components}
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
    per_reward = {name: row["per_reward"] for name, row in results.items() if "per_reward" in row}
    if per_reward:
        rewards = sorted(next(iter(per_reward.values())))
        lines += ["", "Spearman ρ per reward:", f"| variant | {' | '.join(rewards)} |",
                  "|---" * (len(rewards) + 1) + "|"]
        for name, rows in per_reward.items():
            cells = [f"{rows[r]['spearman']:.3f}" for r in rewards]
            lines.append(f"| {name} | {' | '.join(cells)} |")
        paper_rho = [f"{PAPER_SPEARMAN_PER_REWARD[r]:.3f}" if r in PAPER_SPEARMAN_PER_REWARD else "—" for r in rewards]
        lines.append(f"| paper NVFP4 (Table 8) | {' | '.join(paper_rho)} |")
    ref = results["reference"]
    lines.append(f"\nreference: full precision, {ref['steps']} steps, {ref['s_per_candidate']:.4f} s/candidate, "
                 f"mean reward {ref['mean_reward']:.3f}, median reward gap between ranks 12 and 13: "
                 f"{ref['margin@12']:.4f}; candidates with reward > -0.01 (for log p: saturated): "
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
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=[*QUANTIZED_PRECISIONS, "fp8:torchao"],
                        help="precisions, each optionally with its backend (fp8:torchao)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.n < 13:
        parser.error("--n must be at least 13 (hit@12 needs more candidates than 12)")
    torch.set_num_threads(args.threads)
    config = check_inputs(load_config(args.config, args.set)).config  # hub ids → local snapshots, files checked
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
