"""How well a proxy ranking (low-precision exploration) agrees with the true one (full precision).

The metrics are pure functions on reward arrays; the learner logs them every iteration on the seeds
it regenerates (a free rank-fidelity monitor). `measure` samples the paper's Table 8 on a model:
`bench.rank_fidelity` and the demo print it with `format_table`. With several rewards configured,
each one's ranking is measured too (the paper reports ρ per reward), from the one set of samples.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.stats import kendalltau, spearmanr

from diffusion.explore import ExploreEngine
from diffusion.noise import candidate_seeds
from diffusion.policy import FlowPolicy
from diffusion.prompts import load_prompt_set
from learner.config import TrainerConfig
from learner.rollouts import Sampling, generate
from rewards import Reward

KS = (4, 8, 12)


def hit_rate(proxy: np.ndarray, reference: np.ndarray, k: int, *, bottom: bool = False) -> float:
    """|top-k(proxy) ∩ top-k(reference)| / k (bottom-k with bottom=True); ties broken by index."""
    sign = 1.0 if bottom else -1.0
    top_proxy = np.argsort(sign * proxy, kind="stable")[:k]
    top_reference = np.argsort(sign * reference, kind="stable")[:k]
    return len(set(top_proxy) & set(top_reference)) / k


def tolerant_hit_rate(proxy: np.ndarray, reference: np.ndarray, k: int, tolerance: float) -> float:
    """Share of the proxy's top-k whose reference reward is within `tolerance` of the reference's k-th best.

    A miss of the plain hit rate can be a swap between candidates the reference itself cannot tell
    apart (a saturated reward); this counts such picks as good.
    """
    kth_best = np.sort(reference)[::-1][k - 1]
    picked = np.argsort(-proxy, kind="stable")[:k]
    return float(np.mean(reference[picked] >= kth_best - tolerance))


def fidelity(
    proxy: np.ndarray, reference: np.ndarray, ks: tuple[int, ...] = KS, tolerance: float = 0.01
) -> dict[str, float]:
    """Spearman ρ, Kendall τ, top-k and bottom-k hit rates per prompt (rows of [P, N]), averaged.

    `tolerant_hit@k` uses `tolerant_hit_rate` with the given reward tolerance.
    """
    rows = []
    for p, r in zip(np.atleast_2d(proxy), np.atleast_2d(reference), strict=True):
        row = {"spearman": spearmanr(p, r).statistic, "kendall": kendalltau(p, r).statistic}
        for k in ks:
            row[f"hit@{k}"] = hit_rate(p, r, k)
            row[f"bottom_hit@{k}"] = hit_rate(p, r, k, bottom=True)
            row[f"tolerant_hit@{k}"] = tolerant_hit_rate(p, r, k, tolerance)
        rows.append(row)
    out = {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}
    out["mean_abs_reward_error"] = float(np.mean(np.abs(proxy - reference)))
    return out


# ---- measuring it on a model (the paper's Table 8) ----------------------------------------------------
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
    generate(policy, transformer, None, prompts[0], list(range(n)), Sampling(2, sampling.solver))
    rewards, parts = [], {name: [] for name in components}
    start = time.perf_counter()
    for slot, prompt in enumerate(prompts):
        out = generate(policy, transformer, reward, prompt, candidate_seeds(run_seed, 0, slot, n), sampling,
                       metadata=prompt_set.metadata_of(prompt) if prompt_set is not None else None)
        rewards.append(out.rewards.numpy())
        for name in components:
            parts[name].append(out.details[name].numpy())
    return np.stack(rewards), {k: np.stack(v) for k, v in parts.items()}, time.perf_counter() - start


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
    several rewards configured, each reward's under `per_reward`)."""
    prompt_set = load_prompt_set(config.prompts.source)
    prompts = prompt_set.texts
    if num_prompts > len(prompts):
        raise ValueError(f"asked for {num_prompts} prompts but {config.prompts.source!r} has {len(prompts)}")
    prompts = prompts[:num_prompts]
    seed, candidates = config.run.seed, num_prompts * n
    cfg_scale = config.sampler.cfg_scale
    components = tuple(config.reward.weights) if len(config.reward.weights) > 1 else ()
    reference, ref_parts, ref_seconds = sample_rewards(
        policy, reward, prompts, n, seed, Sampling(train_steps, config.sampler.solver, cfg_scale),
        components=components, prompt_set=prompt_set)
    results: dict[str, dict[str, float]] = {
        "reference": {"s_per_candidate": ref_seconds / candidates, "steps": train_steps,
                      "mean_reward": float(reference.mean()), "margin@12": reference_margin(reference),
                      "saturated_fraction": float((reference > -0.01).mean())}
    }
    for name, precision in [("none_explore_steps", "none")] + [(p, p) for p in precisions]:
        engine = None
        if precision != "none":
            engine = ExploreEngine(policy, config.explore.model_copy(update={"precision": precision})).module
        explore = Sampling(explore_steps, config.explore.solver or config.sampler.solver, cfg_scale)
        proxy, parts, seconds = sample_rewards(policy, reward, prompts, n, seed, explore, transformer=engine,
                                               components=components, prompt_set=prompt_set)
        results[name] = {**fidelity(proxy, reference), "s_per_candidate": seconds / candidates,
                         "steps": explore_steps, "mean_reward": float(proxy.mean())}
        if components:
            results[name]["per_reward"] = {c: fidelity(parts[c], ref_parts[c]) for c in components}
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
