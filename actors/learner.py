"""Learner actor: the single-process trainer core behind a Ray handle, publishing through weight sync.

`train(iteration, groups)` selects, regenerates, rewards, updates and publishes — `Trainer` does all of
it; this shell only routes the sampling policy to every node's WeightSyncService instead of a local
engine, checkpoints, and records the dashboard metrics.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
import torch

from actors.metrics import LearnerMetrics
from learner.rollouts import RankedGroup
from learner.trainer import Trainer
from weight_sync.publisher import WeightPublisher


def codec_for(precision: str, requested: str) -> str:
    """auto: NVFP4 engines receive packed NVFP4 weights (the re-quantized broadcast), others dense."""
    if requested != "auto":
        return requested
    return "nvfp4" if precision in ("nvfp4", "nvfp4_w4a16") else "dense"


class Learner:
    def __init__(self, config, run_dir: str | None, services: dict[str, Any], *, resume: bool | str = False,
                 codec: str = "auto", threads: int = 1) -> None:
        """`services`: node id → that node's WeightSyncService (this job's own)."""
        torch.set_num_threads(threads)
        self.codec = codec_for(config.explore.precision, codec)
        self.publisher: WeightPublisher | None = None
        self.trainer = Trainer(config, run_dir, publish=self._publish)
        # The services pull snapshots from this actor (it runs with max_concurrency > 1) and so own them.
        self.publisher = WeightPublisher(services, self.codec, quantize=self.trainer.quantized_weights,
                                         source=ray.get_runtime_context().current_actor)
        self._resume = resume
        self.metrics = LearnerMetrics()
        self._last_end: float | None = None

    def _publish(self, weights: dict[str, torch.Tensor], version: int) -> None:
        if self.publisher is None:
            return  # during Trainer.__init__, before the publisher exists; start() publishes
        if self.codec == "lora":  # only the sampling adapter travels; explorers merge it into their base
            state = self.trainer.state
            if state.mode != "lora":
                raise ValueError("cluster.codec=lora needs training.mode=lora")
            adapters = {k: v.detach() for k, v in state.old_parameters().items()}
            scale = state.config.lora_alpha / state.config.lora_rank
            self.publisher.publish(adapters, version, meta={"lora_scale": scale})
        else:
            self.publisher.publish(weights, version)

    def start(self) -> dict[str, Any]:
        """Resume if asked, then publish the sampling policy (not in __init__: the services pull the
        snapshot from this actor, which cannot answer before its __init__ returns)."""
        if self._resume:  # True: run_dir/checkpoint; a path: that checkpoint folder
            self.trainer.resume(None if self._resume is True else self._resume)  # publishes the resumed policy
        else:
            self.trainer.publish()
        return self.status()

    def snapshot(self, version: int) -> dict:
        """Called by weight-sync services (concurrently with `train`): the newest encoded snapshot."""
        return self.publisher.snapshot(version)

    def status(self) -> dict[str, Any]:
        return {"iteration": self.trainer.iteration, "version": self.trainer.version, "pid": os.getpid()}

    def ensure_published(self) -> list[str]:
        """Re-send the newest snapshot to services that lost it (restarted); their node ids."""
        return self.publisher.republish()

    def train(self, iteration: int, groups: list[RankedGroup], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        trainer = self.trainer
        if iteration != trainer.iteration:
            raise ValueError(f"learner is at iteration {trainer.iteration}, asked to train {iteration}")
        start = time.perf_counter()
        idle = start - self._last_end if self._last_end is not None else 0.0
        metrics = trainer.train_iteration(iteration, groups)
        metrics.update(extra or {})
        metrics["proxy_reward_mean"] = float(torch.cat([g.proxy for g in groups]).mean()) if groups else None
        trainer.finish_iteration(metrics)
        self._last_end = time.perf_counter()
        # idle: waiting for explorers between two updates; busy: this update (with its evaluation)
        metrics["learner_idle_fraction"] = idle / max(idle + self._last_end - start, 1e-9)
        self.metrics.record(metrics)
        return metrics

    def save_final(self, folder: str) -> dict[str, str]:
        return self.trainer.save_final(Path(folder))

    def evaluate(self) -> dict[str, float]:
        return self.trainer.evaluate()

    def evaluate_base(self) -> dict[str, float]:
        """The base model's held-out reward (a fresh run, before any update); saved in the run dir."""
        return self.trainer.evaluate_base()

    def base_evaluation(self) -> dict[str, float]:
        return self.trainer.base_eval

    def sample_images(self, seeds_per_prompt: int = 6) -> torch.Tensor:
        return self.trainer.sample_images(seeds_per_prompt)

    def history(self) -> list[dict[str, Any]]:
        return self.trainer.history
