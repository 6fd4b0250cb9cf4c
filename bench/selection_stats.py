"""What a larger pool changes in the batch the update sees: the selection's statistics per pool size N.

    python -m bench.selection_stats [--config FILE] [--set k=v ...] [--prompts 24] [--pools 24,48,72,96]
                                    --json FILE

The evidence suite measures Sol-RL (N = 96 ranked in low precision, K = 24 kept) at 1.26× DiffusionNFT
(K-in-K: 24 seeds, no pool) per iteration, and its Table 3 shows the gain growing with N. This bench
explains that number from the kept samples themselves, on the base model (the first iteration's policy).

Prompts and seeds are the trainer's: the prompt slots of iterations 0, 1, … (`diffusion.noise.
iteration_prompts`, `prompts.per_iteration` slots each) and each slot's `candidate_seeds(run seed,
iteration, slot, N)`. Those seeds are prefixes of one another (seed j depends only on (run, iteration,
slot, j)), so the pools of N = 24, 48, 72, 96 are nested and N = K is exactly DiffusionNFT's K seeds. Per
slot:

    truth   every one of the largest pool's seeds sampled in full precision at the sampler's steps and
            scored (`generate` with `regeneration_sampling`): what the learner regenerates, and the pool
            naive scaling trains on. A kept seed's true reward is its truth: full-precision sampling is
            per seed (the kept seeds sampled alone agree to 1e-5; tests/bench/test_selection_stats.py).
    Sol-RL  for each N > K the N seeds ranked by the explore engine (`ExploreEngine`, `explore_group` with
            `exploration_sampling`: the explorers' pass) and K kept by `select_candidates` with the run's
            selection mode and generator; at N = K every seed is kept, no ranking needed. Each N is ranked
            in a pass of its own, as an explorer ranks its pool: NVFP4 scales activations by one global
            amax per tensor (`diffusion.quant.nvfp4`), so a seed's proxy depends on the pool it is sampled
            in (on the base model, the first 48 proxies of a 96-pool differed from the 48-pool's by up to
            1.4 in digit_margin, whose within-prompt std is about 5).
    naive   the same N seeds ranked by their truth (the full-precision ranking, naive scaling's selection).

Three tables, each per N (and per ranking where it differs):

    gap          true mean of the kept set's top ⌊K/2⌋ − of its bottom ⌈K/2⌉ (by true reward), averaged over
                 prompts, and its ratio to N = K's; the means of both halves; the within-prompt std of the
                 kept true rewards. Beside it the Gaussian order-statistics prediction σ·(E[mean of the top
                 ⌊K/2⌋ of N] − E[mean of the bottom ⌈K/2⌉ of N]) for standard normals (computed exactly by
                 quadrature, `normal_order_gap`), σ the within-prompt spread of the N = K pool.
    selection    precision: |kept ∩ the full-precision ranking's kept| / K; contrast: the Sol-RL gap ÷ the
                 naive one; the share of the "best" seeds (the proxy's top ⌊K/2⌋) whose true reward is below
                 the pool's true median, and of the "worst" ones above it.
    advantages   the update's advantages (`learner.advantages.compute_advantages` with the run's mode:
                 "all" = per-prompt centred, divided by the std of the whole iteration batch, the
                 `prompts.per_iteration` slots of one iteration) and DiffusionNFT's optimality
                 r = `nft_optimality(A)`: quantiles of A, mean |A|, the share with |r − ½| < 0.05 (almost no
                 signal) and the share clipped at ±adv_clip_max.

Sources: the selection and advantages are the official Sol-RL code's (NVlabs/Sana
`train_scripts/sol_rl/train_sd3.py`, `train_scripts/train_utils.py::select_indices_by_mode`), r is
DiffusionNFT's optimality probability (NVlabs/DiffusionNFT, the NFT loss of its training script; arXiv
2509.16117); the order-statistics argument is the Sol-RL paper's (arXiv 2604.06916, the best–worst gap
growing like 2σ·sqrt(2 log N)). This module reuses the project's functions for all of it.

Cost: per prompt, the largest pool in full precision plus every N > K in low precision (24 prompts: 4 min
on the busy 2-core machine with one thread, the default).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from cluster.config.loading import load_config
from cluster.config.preflight import check_inputs
from diffusion.explore import ExploreEngine
from diffusion.loading import load_policy_from_config
from diffusion.noise import Stream, candidate_seeds, iteration_prompts, stream_generator
from diffusion.prompts import load_prompt_set
from learner.advantages import compute_advantages
from learner.config import TrainerConfig
from learner.objectives import nft_optimality
from learner.rollouts import exploration_sampling, explore_group, generate, regeneration_sampling
from learner.selection import select_candidates
from rewards import Reward, build_reward_from_config

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
NEAR_HALF = 0.05  # |r − ½| below this: the sample's loss is nearly balanced between v⁺ and v⁻
RANKINGS = ("low_precision", "full_precision")  # Sol-RL's explore engine; naive scaling's full-precision pool


def normal_order_gap(n: int, keep: int) -> float:
    """E[mean of the top ⌊keep/2⌋ of n standard normals] − E[mean of the bottom ⌈keep/2⌉], exactly (quadrature).

    E[sum of the top k of n] = n ∫ x φ(x) P(Binomial(n − 1, Φ(x)) ≥ n − k) dx: a draw at x is among the top
    k when at least n − k of the other n − 1 lie below it. The bottom ⌈keep/2⌉ are the top ones' mirror."""
    if not 2 <= keep <= n:
        raise ValueError(f"need 2 <= keep <= n, got keep={keep}, n={n}")
    x = torch.linspace(-10.0, 10.0, 40001, dtype=torch.float64)
    log_cdf, log_sf = torch.special.log_ndtr(x), torch.special.log_ndtr(-x)
    log_pdf = -0.5 * x**2 - 0.5 * math.log(2 * math.pi)

    def top_mean(k: int) -> float:
        j = torch.arange(n - k, n, dtype=torch.float64)  # how many of the other n − 1 lie below x
        log_choose = torch.lgamma(torch.tensor(float(n))) - torch.lgamma(j + 1) - torch.lgamma(n - j)
        log_tail = torch.logsumexp(log_choose[:, None] + j[:, None] * log_cdf + (n - 1 - j[:, None]) * log_sf, 0)
        return float(torch.trapezoid(x * torch.exp(log_pdf + log_tail), x)) * n / k

    return top_mean(keep // 2) + top_mean(keep - keep // 2)


def kept_gap(true: np.ndarray, keep: int) -> tuple[float, float]:
    """(mean of the top ⌊keep/2⌋, mean of the bottom ⌈keep/2⌉) of a kept set's true rewards."""
    ordered = np.sort(true)[::-1]
    return float(ordered[: keep // 2].mean()), float(ordered[keep // 2:].mean())


def trainer_slots(config: TrainerConfig, texts: list[str], count: int) -> list[tuple[int, int, str]]:
    """The first `count` (iteration, slot, prompt) of a run, as the trainer fills its iterations."""
    per = config.prompts.per_iteration
    slots = [(i, s, p) for i in range(-(-count // per))
             for s, p in enumerate(iteration_prompts(texts, config.run.seed, i, per))]
    return slots[:count]


def select(config: TrainerConfig, iteration: int, slot: int, scores: torch.Tensor) -> list[int]:
    """The learner's choice of K among a slot's scores: its selection mode, with its generator."""
    generator = stream_generator(config.run.seed, iteration, Stream.SELECTION, slot)
    return select_candidates(scores, config.prompts.keep, config.learner.selection, generator).tolist()


def sample_prompts(config: TrainerConfig, policy, reward: Reward, num_prompts: int, pools: list[int],
                   log=print) -> list[dict]:
    """Per prompt slot: its seeds, the truth of the largest pool, and for each N the kept indices of both
    rankings (and the low-precision proxies)."""
    keep = config.prompts.keep
    prompt_set = load_prompt_set(config.prompts.source)
    slots = trainer_slots(config, prompt_set.texts, num_prompts)
    engine = ExploreEngine(policy, config.explore).module
    explore, regen = exploration_sampling(config), regeneration_sampling(config)
    rows, start = [], time.perf_counter()
    for number, (iteration, slot, prompt) in enumerate(slots):
        meta = prompt_set.metadata_of(prompt)[0]
        seeds = candidate_seeds(config.run.seed, iteration, slot, max(pools))
        truth = generate(policy, None, reward, prompt, seeds, regen, metadata=meta).rewards
        row = {"iteration": iteration, "slot": slot, "prompt": prompt, "seeds": seeds, "truth": truth.tolist(),
               "kept": {}, "proxy": {}}
        for n in pools:
            pool = candidate_seeds(config.run.seed, iteration, slot, n)
            assert pool == seeds[:n], "candidate seeds are not prefixes of one another"
            kept = {"full_precision": select(config, iteration, slot, truth[:n])}
            if n == keep:  # DiffusionNFT's K-in-K: every seed is kept, whatever ranks them
                kept["low_precision"] = list(range(n))
            else:
                group = explore_group(policy, engine, reward, iteration=iteration, slot=slot, prompt=prompt,
                                      seeds=pool, sampling=explore, policy_version=0, metadata=meta)
                index = {s: i for i, s in enumerate(pool)}  # a halving schedule keeps only its survivors
                kept["low_precision"] = [index[group.seeds[i]] for i in select(config, iteration, slot, group.proxy)]
                row["proxy"][str(n)] = dict(zip(map(str, group.seeds), group.proxy.tolist(), strict=True))
            row["kept"][str(n)] = kept
        rows.append(row)
        log(f"prompt {number + 1}/{len(slots)}, {time.perf_counter() - start:.0f} s")
    return rows


def gap_stats(rows: list[dict], n: int, ranking: str, keep: int) -> dict[str, float]:
    best, worst, std = [], [], []
    for row in rows:
        true = np.asarray(row["truth"])[row["kept"][str(n)][ranking]]
        b, w = kept_gap(true, keep)
        best.append(b), worst.append(w), std.append(true.std(ddof=1))
    return {"gap": float(np.mean(best) - np.mean(worst)), "best_half": float(np.mean(best)),
            "worst_half": float(np.mean(worst)), "kept_std": float(np.mean(std))}


def selection_stats(rows: list[dict], n: int, keep: int) -> dict[str, float | None]:
    """How the low-precision ranking's kept set compares with the full-precision one's (None at N = K)."""
    if n == keep:
        return {"precision": 1.0, "contrast": 1.0, "best_below_median": None, "worst_above_median": None}
    precision, contrast, below, above = [], [], [], []
    for row in rows:
        true = np.asarray(row["truth"][:n])
        lp, fp = row["kept"][str(n)]["low_precision"], row["kept"][str(n)]["full_precision"]
        median = np.median(true)
        precision.append(len(set(lp) & set(fp)) / keep)
        lp_gap, fp_gap = (np.subtract(*kept_gap(true[k], keep)) for k in (lp, fp))
        contrast.append(lp_gap / fp_gap if fp_gap > 0 else 1.0)
        below.append(float((true[lp[: keep // 2]] < median).mean()))
        above.append(float((true[lp[keep // 2:]] > median).mean()))
    return {"precision": float(np.mean(precision)), "contrast": float(np.mean(contrast)),
            "best_below_median": float(np.mean(below)), "worst_above_median": float(np.mean(above))}


def batch_advantages(config: TrainerConfig, rows: list[dict], n: int, ranking: str) -> tuple[torch.Tensor, list]:
    """The advantages [P, K] of the kept samples, computed per iteration batch as the trainer does; and each
    batch's reward std (the normaliser of mode "all")."""
    advantages, stds = [], []
    for iteration in sorted({row["iteration"] for row in rows}):
        batch = [row for row in rows if row["iteration"] == iteration]
        rewards = torch.tensor([[row["truth"][i] for i in row["kept"][str(n)][ranking]] for row in batch])
        advantages.append(compute_advantages(rewards, config.learner.advantage_mode))
        stds.append(float(rewards.std(unbiased=False)))
    return torch.cat(advantages), stds


def advantage_stats(advantages: torch.Tensor, stds: list[float], adv_clip_max: float) -> dict[str, float]:
    a = advantages.flatten().double()
    r = nft_optimality(a, adv_clip_max)
    quantiles = torch.quantile(a, torch.tensor(QUANTILES, dtype=torch.float64))
    return {**{f"q{round(q * 100):02d}": float(v) for q, v in zip(QUANTILES, quantiles, strict=True)},
            "mean_abs": float(a.abs().mean()), "near_half": float(((r - 0.5).abs() < NEAR_HALF).double().mean()),
            "clipped": float((a.abs() >= adv_clip_max).double().mean()), "batch_std": float(np.mean(stds))}


def summarize(config: TrainerConfig, rows: list[dict], pools: list[int]) -> dict:
    keep, clip = config.prompts.keep, config.learner.nft.adv_clip_max
    base = pools[0]
    base_true = np.asarray([row["truth"][:base] for row in rows])
    sigma = float(np.sqrt(base_true.var(axis=1, ddof=1).mean()))
    sigma_all = float(np.sqrt(np.asarray([row["truth"] for row in rows]).var(axis=1, ddof=1).mean()))
    gaussian = {str(n): normal_order_gap(n, keep) for n in pools}
    gap = {ranking: {str(n): gap_stats(rows, n, ranking, keep) for n in pools} for ranking in RANKINGS}
    for ranking in RANKINGS:
        for n in pools:
            g = gap[ranking][str(n)]
            g["ratio"] = g["gap"] / gap[ranking][str(base)]["gap"]
            g["gaussian_gap"] = sigma * gaussian[str(n)]
            g["gaussian_ratio"] = gaussian[str(n)] / gaussian[str(base)]
    advantages = {}
    for ranking in RANKINGS:
        advantages[ranking] = {}
        for n in pools:
            a, stds = batch_advantages(config, rows, n, ranking)
            advantages[ranking][str(n)] = advantage_stats(a, stds, clip)
        for n in pools:
            row = advantages[ranking][str(n)]
            row["mean_abs_ratio"] = row["mean_abs"] / advantages[ranking][str(base)]["mean_abs"]
    return {"keep": keep, "pools": pools, "sigma": sigma, "sigma_largest_pool": sigma_all,
            "normal_order_gap": gaussian, "adv_clip_max": clip, "advantage_mode": config.learner.advantage_mode,
            "gap": gap, "selection": {str(n): selection_stats(rows, n, keep) for n in pools},
            "advantages": advantages}


def _ranking_rows(results: dict, pools: list[int]):
    """(N, ranking label, ranking key): at N = K both rankings keep the same set, so one row."""
    for n in pools:
        if n == results["keep"]:
            yield n, "— (K-in-K, all kept)", "low_precision"
        else:
            yield n, "low precision (Sol-RL)", "low_precision"
            yield n, "full precision (naive scaling)", "full_precision"


def format_tables(results: dict) -> str:
    pools, keep = results["pools"], results["keep"]
    half, rest = keep // 2, keep - keep // 2
    lines = [f"Kept true rewards (K = {keep}): gap = mean of the kept top {half} − of the bottom {rest} by true "
             f"reward; Gaussian: σ·E[order-statistics gap of N], σ = {results['sigma']:.3f} (the N = {pools[0]} "
             f"pools' within-prompt std; over all {pools[-1]}: {results['sigma_largest_pool']:.3f})", "",
             f"| N | ranking | gap | ÷ N = {pools[0]} | best-half mean | worst-half mean | kept std | Gaussian gap "
             f"| Gaussian ÷ N = {pools[0]} |", "|---" * 9 + "|"]
    for n, label, key in _ranking_rows(results, pools):
        g = results["gap"][key][str(n)]
        lines.append(f"| {n} | {label} | {g['gap']:.3f} | {g['ratio']:.3f} | {g['best_half']:.3f} | "
                     f"{g['worst_half']:.3f} | {g['kept_std']:.3f} | {g['gaussian_gap']:.3f} | "
                     f"{g['gaussian_ratio']:.3f} |")
    lines += ["", "Selection by the low-precision ranking against the full-precision one (truth of every candidate)",
              "", f"| N | precision | contrast | best {half} below the pool's true median | worst {rest} above it |",
              "|---|---|---|---|---|"]
    for n in pools:
        s = results["selection"][str(n)]
        cells = ["—" if s[k] is None else f"{s[k]:.3f}" for k in ("best_below_median", "worst_above_median")]
        lines.append(f"| {n} | {s['precision']:.3f} | {s['contrast']:.3f} | {cells[0]} | {cells[1]} |")
    clip = results["adv_clip_max"]
    lines += ["", f"Advantages (mode {results['advantage_mode']!r}, per iteration batch) and r = nft_optimality(A), "
              f"adv_clip_max = {clip:g}", "",
              f"| N | ranking | A q05 | q25 | q50 | q75 | q95 | mean abs A | ÷ N = {pools[0]} | abs(r − ½) < 0.05 | "
              "clipped | batch std |", "|---" * 12 + "|"]
    for n, label, key in _ranking_rows(results, pools):
        a = results["advantages"][key][str(n)]
        lines.append(f"| {n} | {label} | {a['q05']:.2f} | {a['q25']:.2f} | {a['q50']:.2f} | {a['q75']:.2f} | "
                     f"{a['q95']:.2f} | {a['mean_abs']:.3f} | {a['mean_abs_ratio']:.3f} | {a['near_half']:.3f} | "
                     f"{a['clipped']:.3f} | {a['batch_std']:.3f} |")
    return "\n".join(lines)


def parse_pools(text: str) -> list[int]:
    return sorted({int(n) for n in text.split(",")})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/embedded.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--pools", type=parse_pools, default=[24, 48, 72, 96],
                        help="pool sizes N; the smallest must be K (DiffusionNFT's K-in-K, the baseline)")
    # One thread: on a busy 2-core machine two threads spin against the other load (100 s a prompt, 9 s with one).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    config = check_inputs(load_config(args.config, args.set)).config  # hub ids → local snapshots, files checked
    keep = config.prompts.keep
    if args.pools[0] != keep:
        parser.error(f"--pools: the smallest pool must be K = {keep} (the K-in-K baseline), got {args.pools}")
    if args.prompts < 1:
        parser.error("--prompts must be at least 1")
    torch.set_num_threads(args.threads)
    policy = load_policy_from_config(config.model)
    reward = build_reward_from_config(config.reward)
    start = time.perf_counter()
    rows = sample_prompts(config, policy, reward, args.prompts, args.pools)
    results = summarize(config, rows, args.pools)
    seconds = time.perf_counter() - start
    print(format_tables(results))
    print(f"\n{len(rows)} prompts, {seconds:.0f} s")
    out = {"args": {k: str(v) for k, v in vars(args).items()}, "seconds": seconds,
           "explore": {"precision": config.explore.precision, "steps": config.explore.steps,
                       "schedule": config.explore.schedule},
           "sampler_steps": config.sampler.steps, "selection_mode": config.learner.selection,
           "reward": dict(config.reward.weights), **results, "per_prompt": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
