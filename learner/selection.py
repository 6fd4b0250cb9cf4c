"""Which K of a prompt's N explored seeds the learner regenerates and trains on.

Sol-RL's default, `best_worst`, keeps the K/2 highest and K/2 lowest proxy rewards: the strongest
contrast, whose expected best–worst gap grows like 2σ·sqrt(2 log N). An odd K gives the extra seed to
the worst group (⌊K/2⌋ best, ⌈K/2⌉ worst), as the official code's `select_indices_by_mode`
(NVlabs/Sana `train_scripts/train_utils.py`) does; the other modes are that function's too. Random
choices use a generator the caller seeds from (run seed, iteration, slot), so a selection is
reproducible anywhere. Ties are broken by candidate index (stable sorts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

SelectionMode = Literal["best_worst", "random", "mean_deviation", "extremes_random"]
Select = Callable[[torch.Tensor, int, torch.Generator | None], torch.Tensor]


def _best_worst(proxy: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    order = torch.argsort(proxy, descending=True, stable=True)
    n_best = k // 2
    return torch.cat([order[:n_best], torch.flip(order, [0])[: k - n_best]])


def _mean_deviation(proxy: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    return torch.argsort((proxy - proxy.mean()).abs(), descending=True, stable=True)[:k]


def _random(proxy: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    return torch.randperm(proxy.numel(), generator=generator)[:k]


def _extremes_random(proxy: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    order = torch.argsort(proxy, descending=True, stable=True)
    rest = order[1:-1]
    return torch.cat([order[:1], order[-1:], rest[torch.randperm(rest.numel(), generator=generator)[: k - 2]]])


SELECTION_MODES: dict[str, Select] = {
    "best_worst": _best_worst,
    "random": _random,
    "mean_deviation": _mean_deviation,
    "extremes_random": _extremes_random,
}
RANDOM_MODES = frozenset({"random", "extremes_random"})  # the modes that draw from the generator


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
    if mode in RANDOM_MODES and generator is None:
        raise ValueError(f"selection mode {mode!r} draws at random: pass a seeded generator")
    return SELECTION_MODES[mode](proxy, k, generator)
