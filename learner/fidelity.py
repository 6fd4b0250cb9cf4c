"""How well a proxy ranking (low-precision exploration) agrees with the true one (full precision).

Pure functions on reward arrays. `rank_fidelity` is what the learner logs every iteration on the seeds it
regenerates (a free monitor of the explorers' ranking); `fidelity` is the fuller set of the paper's Table 8,
which `bench.rank_fidelity` measures on a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

KS = (4, 8, 12)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1…n of x, ties sharing their mean rank (scipy.stats.rankdata's "average")."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # 0-based rank of each distinct value's first member
    return (first + (counts + 1) / 2.0)[inverse.reshape(-1)]


def spearman(proxy: np.ndarray, reference: np.ndarray) -> float:
    """Spearman ρ of one group's proxy against its reference rewards: Pearson's r of their average ranks,
    as scipy.stats.spearmanr (NaN when either is constant). In numpy, not scipy: importing scipy.stats costs
    every learner process about a second, and the learner logs ρ every iteration."""
    a, b = average_ranks(np.ravel(proxy)), average_ranks(np.ravel(reference))
    a, b = a - a.mean(), b - b.mean()
    norm = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / norm if norm > 0 else math.nan


def selection_precision(proxy: np.ndarray, reference: np.ndarray) -> float:
    """Share of the group the proxy puts on the same side of its median as the reference does."""
    return float(np.mean((proxy > np.median(proxy)) == (reference > np.median(reference))))


def rank_fidelity(pairs: Sequence[tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray]]) -> dict[str, float]:
    """`rank_spearman` (mean ρ over the groups that have one) and `selection_precision` (mean over all) of
    (proxy, true rewards) pairs, one per group (tensors or arrays); {} without pairs."""
    if not pairs:
        return {}
    arrays = [(np.asarray(proxy), np.asarray(reference)) for proxy, reference in pairs]
    rho = [spearman(p, r) for p, r in arrays]
    rho = [x for x in rho if not math.isnan(x)] or [math.nan]  # constant rewards have no ρ
    precision = [selection_precision(p, r) for p, r in arrays]
    return {"rank_spearman": float(np.mean(rho)), "selection_precision": float(np.mean(precision))}


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
    from scipy.stats import kendalltau  # here, not at the top: only the benches' fuller table needs τ

    rows = []
    for p, r in zip(np.atleast_2d(proxy), np.atleast_2d(reference), strict=True):
        row = {"spearman": spearman(p, r), "kendall": kendalltau(p, r).statistic}
        for k in ks:
            row[f"hit@{k}"] = hit_rate(p, r, k)
            row[f"bottom_hit@{k}"] = hit_rate(p, r, k, bottom=True)
            row[f"tolerant_hit@{k}"] = tolerant_hit_rate(p, r, k, tolerance)
        rows.append(row)
    out = {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}
    out["mean_abs_reward_error"] = float(np.mean(np.abs(proxy - reference)))
    return out
