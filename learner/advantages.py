"""Advantages from the high-precision rewards of the kept samples.

A = (R − mean of the prompt's K rewards) / (std over every reward of the batch + 1e-4)
— per-prompt centring, global scale (DiffusionNFT / Sol-RL). The advantage modes are those of the
official code (NVlabs/Sana `train_scripts/sol_rl/train_sd3.py`, the advantage computation of the
training loop), each a function in `ADVANTAGE_MODES`. Several rewards are combined by a weighted sum
*before* this (rewards.WeightedSum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

AdvantageMode = Literal["all", "positive_only", "negative_only", "one_only", "binary"]


def centred_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """rewards [P, K] (P prompts, K kept samples each) → A [P, K], float32, as above."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [prompts, samples], got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(unbiased=False) + eps)


# How each mode reshapes A.
ADVANTAGE_MODES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "all": lambda adv: adv,
    "positive_only": lambda adv: adv.clamp(0.0, 100.0),
    "negative_only": lambda adv: adv.clamp(-100.0, 0.0),
    "one_only": lambda adv: (adv > 0).float(),
    "binary": torch.sign,
}


def compute_advantages(rewards: torch.Tensor, mode: AdvantageMode = "all", eps: float = 1e-4) -> torch.Tensor:
    """rewards [P, K] → advantages [P, K], float32.

    all:            A
    positive_only:  clamp(A, 0, 100)
    negative_only:  clamp(A, −100, 0)
    one_only:       1 where A > 0, else 0
    binary:         sign(A)
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}: choose one of {', '.join(ADVANTAGE_MODES)}")
    return ADVANTAGE_MODES[mode](centred_advantages(rewards, eps))
