"""Which K of a prompt's N explored seeds the learner regenerates and trains on.

Sol-RL's default, `best_worst`, keeps the K/2 highest and K/2 lowest proxy rewards: the strongest
contrast, whose expected best–worst gap grows like 2σ·sqrt(2 log N). An odd K gives the extra seed to
the worst group (⌊K/2⌋ best, ⌈K/2⌉ worst), as the official code's `select_indices_by_mode` does. The
other modes are those of the official code. Random choices use a generator the caller seeds from
(run seed, iteration, slot), so a selection is reproducible anywhere. Ties are broken by candidate
index (stable sorts).
"""

from __future__ import annotations

from typing import Literal

import torch

SelectionMode = Literal["best_worst", "random", "mean_deviation", "extremes_random"]
SELECTION_MODES: tuple[str, ...] = ("best_worst", "random", "mean_deviation", "extremes_random")


def select_candidates(
    proxy: torch.Tensor, k: int, mode: SelectionMode = "best_worst", generator: torch.Generator | None = None
) -> torch.Tensor:
    """Indices (int64 [k]) into a prompt's N proxy rewards.

    best_worst:      top ⌊k/2⌋ by reward (descending) then bottom k − ⌊k/2⌋ = ⌈k/2⌉ (ascending)
    random:          k distinct indices uniformly at random
    mean_deviation:  top k by |r − mean r|
    extremes_random: argmax, argmin, then k − 2 random among the rest
    """
    n = proxy.numel()
    if proxy.dim() != 1:
        raise ValueError(f"proxy rewards must be 1-D [N], got shape {tuple(proxy.shape)}")
    if not 2 <= k <= n:
        raise ValueError(f"cannot keep k={k} of n={n} candidates: need 2 <= k <= n")
    if mode not in SELECTION_MODES:
        raise ValueError(f"unknown selection mode {mode!r}: choose one of {', '.join(SELECTION_MODES)}")
    if k == n:
        return torch.arange(n)
    order = torch.argsort(proxy, descending=True, stable=True)
    if mode == "best_worst":
        n_best = k // 2
        return torch.cat([order[:n_best], torch.flip(order, [0])[: k - n_best]])
    if mode == "mean_deviation":
        return torch.argsort((proxy - proxy.mean()).abs(), descending=True, stable=True)[:k]
    if generator is None:
        raise ValueError(f"selection mode {mode!r} draws at random: pass a seeded generator")
    if mode == "random":
        return torch.randperm(n, generator=generator)[:k]
    best, worst = order[0], order[-1]
    rest = order[1:-1]
    return torch.cat([best.view(1), worst.view(1), rest[torch.randperm(n - 2, generator=generator)[: k - 2]]])
