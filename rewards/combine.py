"""A weighted sum of several rewards, taken per sample before any advantage is computed.

total[i] = Σ_name weights[name] · rewards[name](images, prompts)[i]

`details` holds every component's reward under its own name (e.g. "digit_alignment") and every
component's diagnostics prefixed with it (e.g. "digit_alignment/accuracy").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from rewards.base import Metadata, Reward

Scores = tuple[torch.Tensor, dict[str, torch.Tensor]]


def combine_components(components: Mapping[str, Scores], weights: Mapping[str, float]) -> Scores:
    """Σ weights[name] · scores[name] per sample, with every component kept in the details.

    `components`: name → (scores [B], diagnostics) as `Reward.score_and_details` returns them, so the
    components may be scored anywhere (here, or by `actors.reward_scorer.RewardScorer` actors)."""
    total: torch.Tensor | None = None
    details: dict[str, torch.Tensor] = {}
    for name, weight in weights.items():
        scores, component_details = components[name]
        total = weight * scores.float() if total is None else total + weight * scores.float()
        details[name] = scores
        details.update({f"{name}/{key}": value for key, value in component_details.items()})
    if total is None:
        raise ValueError("combine_components needs at least one weighted component")
    return total, details


class WeightedSum(Reward):
    """Σ weights[name] · rewards[name]; weights are non-negative with a positive sum."""

    name = "weighted_sum"

    def __init__(self, rewards: Mapping[str, Reward], weights: Mapping[str, float]) -> None:
        if not rewards:
            raise ValueError("WeightedSum needs at least one reward, got none")
        if set(rewards) != set(weights):
            raise ValueError(
                f"rewards and weights must name the same rewards: rewards {sorted(rewards)}, "
                f"weights {sorted(weights)}"
            )
        for name, weight in weights.items():
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"weight of {name!r} must be finite and non-negative, got {weight}")
        if sum(weights.values()) <= 0:
            raise ValueError(f"weights must have a positive sum, got {dict(weights)}")
        for name, reward in rewards.items():
            if "/" in name:
                raise ValueError(f"reward name {name!r} must not contain '/' (used as the details separator)")
            if not isinstance(reward, Reward):
                raise ValueError(f"reward {name!r} must be a Reward, got {type(reward).__name__}")
        self.rewards = dict(rewards)
        self.weights = {name: float(weights[name]) for name in self.rewards}

    def _compute(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        components = {name: r.score_and_details(images, prompts, metadata) for name, r in self.rewards.items()}
        return combine_components(components, self.weights)

    def __repr__(self) -> str:
        return f"WeightedSum({self.weights})"
