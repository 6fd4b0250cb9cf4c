"""The `reward` section of a run's config, and the reward it builds.

reward:
  weights: {digit_alignment: 1.0}        # reward name → weight (> 0)
  digit_classifier_path: null            # null → the committed rewards/artifacts/digit_classifier
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rewards.base import Reward, build_reward, known_rewards
from rewards.combine import WeightedSum


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=lambda: {"digit_alignment": 1.0})
    # Folder holding config.json + model.safetensors; a relative path is taken from the CWD.
    digit_classifier_path: str | None = None

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


def build_reward_from_config(cfg: RewardConfig) -> Reward:
    """The configured reward: the single reward when one is named with weight 1, else a WeightedSum."""
    rewards: dict[str, Reward] = {}
    for name in cfg.weights:
        options: dict[str, object] = {}
        if name == "digit_alignment" and cfg.digit_classifier_path is not None:
            options["path"] = cfg.digit_classifier_path
        rewards[name] = build_reward(name, **options)
    if len(rewards) == 1 and next(iter(cfg.weights.values())) == 1.0:
        return next(iter(rewards.values()))
    return WeightedSum(rewards, cfg.weights)
