"""RewardScorer actors: the reward models on devices of their own, serving explorers and the learner.

Without scorers every explorer and the learner load the configured rewards beside their diffusion
model. With `cluster.scorers.count > 0` the reward models (a CLIP-H PickScore, a BLIP ImageReward…)
live only in scorer actors, each loaded once per scorer; explorers and the learner send decoded
images (numpy through the object store, zero-copy on the node) and get back per-component scores.
The images travel as uint8 when every configured reward declares `reads_uint8` (it rounds to 8 bits
first and reads nothing else, so the scores are bitwise those of the floats: a quarter of the bytes),
else as float32 (`rewards.uint8_images`). A scorer batches the requests of all its callers
(`RequestBatcher`: up to `max_batch` images or `max_wait_ms`), scores every configured reward on the
batch, and returns each caller its slice. The caller combines the components with the configured
weights (`combine_components`), so the weighting is decided in one place, and each component stays
visible in the diagnostics and the metrics (the learner's `solrl_reward_component{reward=<name>}`); a
scorer counts its requests, batches, images and busy seconds (`solrl_scorer_*`).

A scorer holds no state but its models: when one dies, Ray restarts it (`max_restarts=-1`) and
retries the call (`max_task_retries=-1`), and the restarted scorer scores the same images to the same
values.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
import torch

from actors.identity import actor_name
from actors.metrics import ScorerMetrics
from actors.request_batching import RequestBatcher
from rewards import Metadata, Reward
from rewards.combine import Scores, combine_components
from rewards.config import RewardConfig, build_reward_components, is_single
from rewards.uint8_images import image_payload, payload_images, reads_only_uint8

ScoreRequest = tuple[np.ndarray, list[str], list[dict[str, Any]]]
ComponentScores = dict[str, Scores]


def score_components(rewards: dict[str, Reward], requests: Sequence[ScoreRequest]) -> list[ComponentScores]:
    """Score a batch of callers' requests with every reward, one model call per reward per image shape.

    Rewards score each image independently of the others in its batch (each reward's tests check
    batch-size invariance), so a caller's slice equals what scoring its images alone would give.
    Payloads are float32 or uint8 (`rewards.uint8_images.image_payload`); uint8 ones only for rewards that
    all declare `reads_uint8` (ValueError otherwise: they would score other values than the floats)."""
    results: list[ComponentScores] = [{} for _ in requests]
    by_kind: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, (images, _, _) in enumerate(requests):
        by_kind.setdefault((images.dtype.str, tuple(images.shape[1:])), []).append(i)
    if any(dtype == np.dtype(np.uint8).str for dtype, _ in by_kind) and not reads_only_uint8(rewards):
        floats = sorted(name for name in rewards if not reads_only_uint8([name]))
        raise ValueError(f"uint8 images for {', '.join(floats)}, which read float pixels: send float32")
    for members in by_kind.values():
        images = payload_images(np.concatenate([requests[i][0] for i in members]))
        prompts = [p for i in members for p in requests[i][1]]
        metadata = [m for i in members for m in requests[i][2]]
        counts = [len(requests[i][1]) for i in members]
        for name, reward in rewards.items():
            scores, details = reward.score_and_details(images, prompts, metadata)
            for part, i in enumerate(members):
                start = sum(counts[:part])
                window = slice(start, start + counts[part])
                results[i][name] = (scores[window].clone(), {k: v[window].clone() for k, v in details.items()})
    return results


class RewardScorer:
    """A Ray actor (async: it keeps accepting requests while a batch is scored)."""

    def __init__(self, reward: RewardConfig, *, max_batch: int = 64, max_wait_ms: float = 20.0,
                 threads: int = 1, index: int = 0, run: str = "") -> None:
        torch.set_num_threads(threads)
        self.name = actor_name("scorer", index)
        self.rewards = build_reward_components(reward)  # the one model load of this scorer
        self.batcher: RequestBatcher[ScoreRequest, ComponentScores] = RequestBatcher(
            self._score_batch, max_items=max_batch, max_wait_s=max_wait_ms / 1000.0, size=lambda r: len(r[1]))
        self.metrics = ScorerMetrics(run, index)
        self.received_bytes: dict[str, int] = {}  # image payload bytes received, by dtype (this process)

    def __repr__(self) -> str:  # Ray's log prefix and the dashboard's name for it
        return getattr(self, "name", "solrl-scorer")

    def _score_batch(self, requests: list[ScoreRequest]) -> list[ComponentScores]:
        start = time.perf_counter()
        results = score_components(self.rewards, requests)
        self.metrics.scored(sum(len(r[1]) for r in requests), time.perf_counter() - start)
        return results

    async def score(self, images: np.ndarray, prompts: list[str], metadata: list[dict[str, Any]]) -> ComponentScores:
        """Each configured reward's (scores, diagnostics) for these images, scored in a shared batch."""
        self.metrics.requests.inc()
        self.received_bytes[images.dtype.name] = self.received_bytes.get(images.dtype.name, 0) + images.nbytes
        return await self.batcher.submit((images, prompts, metadata))

    def batch_sizes(self) -> list[int]:
        """Images per batch scored so far by this process (it restarts empty)."""
        return list(self.batcher.batch_sizes)

    def received(self) -> dict[str, int]:
        """Bytes of image payloads received so far by this process, by dtype ("uint8", "float32")."""
        return dict(self.received_bytes)


class RemoteReward(Reward):
    """The configured reward, scored by RewardScorer actors and combined here with the weights.

    Calls go round robin over the scorers; every scorer holds the same models, so which one scores
    a batch does not change its values. Inputs are validated before they travel, as uint8 when every
    configured reward reads only 8 bits (`uint8`), else as float32."""

    name = "remote"

    def __init__(self, scorers: Sequence[ray.actor.ActorHandle], config: RewardConfig) -> None:
        if not scorers:
            raise ValueError("RemoteReward needs at least one RewardScorer actor")
        self.scorers = list(scorers)
        self.config = config
        self.uint8 = reads_only_uint8(config.weights)
        self._calls = 0

    def payload(self, images: torch.Tensor) -> np.ndarray:
        """The pixels that travel to a scorer for `images` (uint8 or float32, [B, C, H, W])."""
        return image_payload(images, self.uint8)

    def _compute(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Metadata]) -> Scores:
        scorer = self.scorers[self._calls % len(self.scorers)]
        self._calls += 1
        pixels = self.payload(images)
        components = ray.get(scorer.score.remote(pixels, list(prompts), [dict(m) for m in metadata]))
        if is_single(self.config):
            return components[next(iter(self.config.weights))]
        return combine_components(components, self.config.weights)
