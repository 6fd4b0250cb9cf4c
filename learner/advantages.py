"""Advantages from the high-precision rewards of the kept samples.

A = (R − mean of the prompt's K rewards) / (std over every reward of the batch + 1e-4)
— per-prompt centring, global scale (DiffusionNFT / Sol-RL). The advantage modes are those of the
official code. Several rewards are combined by a weighted sum *before* this (rewards.WeightedSum).
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageMode = Literal["all", "positive_only", "negative_only", "one_only", "binary"]
ADVANTAGE_MODES: tuple[str, ...] = ("all", "positive_only", "negative_only", "one_only", "binary")


def compute_advantages(rewards: torch.Tensor, mode: AdvantageMode = "all", eps: float = 1e-4) -> torch.Tensor:
    """rewards [P, K] (P prompts, K kept samples each) → advantages [P, K], float32.

    all:            A as above
    positive_only:  clamp(A, 0, 100)
    negative_only:  clamp(A, −100, 0)
    one_only:       1 where A > 0, else 0
    binary:         sign(A)
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [prompts, samples], got shape {tuple(rewards.shape)}")
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}: choose one of {', '.join(ADVANTAGE_MODES)}")
    rewards = rewards.float()
    adv = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(unbiased=False) + eps)
    if mode == "positive_only":
        return adv.clamp(0.0, 100.0)
    if mode == "negative_only":
        return adv.clamp(-100.0, 0.0)
    if mode == "one_only":
        return (adv > 0).float()
    if mode == "binary":
        return torch.sign(adv)
    return adv
