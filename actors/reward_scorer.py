"""RewardScorer actors: reward models that need a device of their own, shared by the explorers.

Explorers normally score on their own device (co-located: images never leave it). A heavy reward
model (a CLIP-H PickScore, a BLIP ImageReward) can instead run in `cluster.scorers.count` actors with
their own GPUs; explorers then send decoded images to them (on the node, through the object store)
and get back only the scores. `RemoteReward` makes such actors look like any other `Reward`.
"""

from __future__ import annotations

from collections.abc import Sequence

import ray
import torch

from rewards import Reward, build_reward_from_config
from rewards.config import RewardConfig


class RewardScorer:
    def __init__(self, reward: RewardConfig, threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.reward = build_reward_from_config(reward)

    def score(self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None):
        return self.reward.score_and_details(images, prompts, metadata)


class RemoteReward(Reward):
    """A Reward computed by RewardScorer actors, round robin; inputs are validated before they travel."""

    name = "remote"

    def __init__(self, scorers: Sequence[ray.actor.ActorHandle]) -> None:
        if not scorers:
            raise ValueError("RemoteReward needs at least one RewardScorer actor")
        self.scorers = list(scorers)
        self._calls = 0

    def _compute(self, images: torch.Tensor, prompts: Sequence[str], metadata):
        scorer = self.scorers[self._calls % len(self.scorers)]
        self._calls += 1
        return ray.get(scorer.score.remote(images.detach().cpu(), list(prompts), list(metadata)))
