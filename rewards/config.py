"""The `reward` section of a run's config, and the reward it builds.

reward:
  weights: {digit_alignment: 1.0}            # reward name → weight (> 0)
  options:                                   # reward name → its constructor's keyword arguments
    digit_alignment: {path: null}            # null → the committed rewards/artifacts/digit_classifier
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rewards.base import Reward, build_reward, known_rewards, require_files, reward_class
from rewards.combine import WeightedSum


def reward_options(name: str) -> list[str]:
    """The keyword arguments reward `name` is built with (its constructor's named parameters)."""
    parameters = inspect.signature(reward_class(name)).parameters.values()
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=lambda: {"digit_alignment": 1.0})
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per reward: keyword arguments of its constructor, e.g. "
        "{digit_alignment: {path: FOLDER}}; a relative path is taken from the current directory")

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, weights: dict[str, float]) -> dict[str, float]:
        if not weights:
            raise ValueError(
                f"weights must name at least one reward; known rewards: {', '.join(known_rewards())}"
            )
        unknown = sorted(set(weights) - set(known_rewards()))
        if unknown:
            raise ValueError(f"unknown reward(s) {unknown}; known rewards: {', '.join(known_rewards())}")
        bad = {name: weight for name, weight in weights.items() if not weight > 0 or weight == float("inf")}
        if bad:
            raise ValueError(f"reward weights must be positive and finite, got {bad}")
        return weights

    @field_validator("options")
    @classmethod
    def _check_options(cls, options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, given in options.items():
            if name not in known_rewards():
                raise ValueError(f"options for unknown reward {name!r}; known rewards: {', '.join(known_rewards())}")
            accepted = reward_options(name)
            unknown = sorted(set(given) - set(accepted))
            if unknown:
                raise ValueError(f"{name} has no option(s) {unknown}; it takes: {', '.join(accepted) or 'none'}")
        return options


def is_single(cfg: RewardConfig) -> bool:
    """One reward of weight 1: the reward is that model itself (its own diagnostics, no weighted sum)."""
    return len(cfg.weights) == 1 and next(iter(cfg.weights.values())) == 1.0


def build_reward_components(cfg: RewardConfig) -> dict[str, Reward]:
    """Each configured reward model, built (weights loaded) once, by name."""
    return {name: build_reward(name, **cfg.options.get(name, {})) for name in cfg.weights}


def build_reward_from_config(cfg: RewardConfig) -> Reward:
    """The configured reward: the single reward when one is named with weight 1, else a WeightedSum."""
    rewards = build_reward_components(cfg)
    if is_single(cfg):
        return next(iter(rewards.values()))
    return WeightedSum(rewards, cfg.weights)


def check_reward_files(cfg: RewardConfig) -> None:
    """FileNotFoundError naming each configured reward's missing weight file and where it comes from,
    before any model loads (`Reward.required_files`)."""
    for name in cfg.weights:
        require_files(name, reward_class(name).required_files(**cfg.options.get(name, {})))
