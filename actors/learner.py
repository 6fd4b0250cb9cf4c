"""Learner actor: the learner's parts (`learner.trainer.Trainer`) behind a Ray handle, publishing through
weight sync.

The driver calls, per iteration: `regenerate(iteration, group)` for each ranked group as it arrives
(streamed: select and regenerate that slot while the other slots are still explored), `train(iteration,
groups)` (any slot not streamed yet, then the update: a `TrainResult`), `publish()` (the sampling policy
to every node's WeightSyncService), `finish_iteration()` (the evaluation when due) and, once it has
written the iteration's record, `checkpoint()`.

Two concurrency groups: the default one runs those calls one at a time, in the order the driver sent
them (they share the model); "sync" serves the weight-sync services' `snapshot` pulls (and republishing)
while a long `train` runs.

A learner group (`cluster.learner.count` = L) is L of these actors, one per GPU, joined in one
`torch.distributed` process group (`learner.data_parallel`): the driver sends `start`, `train`,
`publish` and `finish_iteration` to every rank and each slot's `regenerate` to the rank that owns it.
Only rank 0 evaluates, checkpoints and publishes to the weight-sync services; every rank resumes from
rank 0's checkpoint (the run directory must be on storage every learner node reads).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import ray
import torch

from actors.identity import actor_name
from actors.reward_scorer import RemoteReward
from diffusion.explore import ExplorePlan
from learner import data_parallel
from learner.data_parallel import Shard
from learner.experiment_log import GridSamples
from learner.iteration_record import Finished, Published, TrainResult
from learner.rollouts import RankedGroup
from learner.trainer import Trainer
from weight_sync.publisher import WeightPublisher


def codec_for(plan: ExplorePlan, requested: str) -> str:
    """auto: engines with NVFP4 weights receive them packed (the re-quantized broadcast), others dense."""
    if requested != "auto":
        return requested
    return "nvfp4" if plan.quantized_weights else "dense"


class Learner:
    def __init__(self, config, run_dir: str | None, services: dict[str, Any], *, resume: bool | str = False,
                 codec: str = "auto", threads: int = 1, scorers: list | None = None, rank: int = 0,
                 world: int = 1) -> None:
        """`services`: node id → that node's WeightSyncService (this job's own); `scorers`: RewardScorer
        actors that hold the reward models (None: the trainer loads them here); `rank` of `world`: this
        actor's place in the learner group (the driver then calls `join` on every rank). The run's
        dashboard series are the driver's (`learner.run_log.RunLog`)."""
        torch.set_num_threads(threads)
        self.name = actor_name("learner", rank)
        self.shard = Shard(rank, world)
        reward = RemoteReward(scorers, config.reward) if scorers else None
        self.trainer = Trainer(config, run_dir if self.shard.main else None, remote_explorers=True, reward=reward,
                               shard=self.shard)
        self.codec = codec_for(self.trainer.explore_plan, codec)
        # The services pull snapshots from this actor (it runs with max_concurrency > 1) and so own them.
        self.publisher = WeightPublisher(services, self.codec, quantize=self.trainer.explore_plan.quantized_weights,
                                         source=ray.get_runtime_context().current_actor) if self.shard.main else None
        if resume is True and not self.shard.main:  # every rank reads rank 0's checkpoint
            resume = str(Path(run_dir) / "checkpoint")
        self._resume = resume
        self._last_end: float | None = None
        self._busy_since = self._idle = 0.0

    def __repr__(self) -> str:  # Ray's log prefix and the dashboard's name for it
        return getattr(self, "name", "solrl-learner")

    def address(self) -> str:
        """Rank 0: the learner group's rendezvous address (a free port on this node)."""
        return data_parallel.free_address()

    def join(self, address: str, timeout_s: float, network: dict[str, str | None]) -> str:
        """Join the learner group's process group (every rank at once), its collectives on the interface
        `network` (cluster.learner.network: interface, subnet) names or the one carrying this node's IP;
        where they bind, in words (the driver logs it)."""
        node_ip = ray.util.get_node_ip_address()
        binding = data_parallel.join(address, self.shard, timeout_s, node_ip=node_ip, **network)
        return f"{self.name} on {node_ip}: collectives on {binding.describe()}"

    def start(self) -> dict[str, Any]:
        """Resume if asked (True: run_dir/checkpoint; a path: that checkpoint folder). The driver then
        publishes: not in __init__, because the services pull the snapshot from this actor, which cannot
        answer before its __init__ returns."""
        if self._resume:
            self.trainer.resume(None if self._resume is True else self._resume)
        return self.status()

    def publish(self) -> Published:
        """Send the sampling policy θ_old to every node's weight-sync service (and a local engine, when
        the algorithm trains on low-precision samples): the driver's explicit step after each update."""
        start, trainer = time.perf_counter(), self.trainer
        if not self.shard.main:  # rank 0 publishes; another rank only loads a local engine it may hold
            trainer.publish()
            return Published(trainer.version, time.perf_counter() - start)
        weights = trainer.sampling_weights()
        if self.codec == "lora":  # only the sampling adapter travels; explorers merge it into their base
            adapters = {k: v.detach() for k, v in trainer.state.old_parameters().items()}
            info = self.publisher.publish(adapters, trainer.version, meta={"lora_scale": trainer.state.lora_scale})
        else:
            info = self.publisher.publish(weights, trainer.version)
        trainer.publish(weights)
        return Published(trainer.version, time.perf_counter() - start,
                         info["bytes"] * len(self.publisher.services))  # one copy to each node

    @ray.method(concurrency_group="sync")
    def snapshot(self, version: int) -> dict:
        """Called by weight-sync services (concurrently with `train`): the newest encoded snapshot."""
        return self.publisher.snapshot(version)

    def status(self) -> dict[str, Any]:
        return {"iteration": self.trainer.iteration, "version": self.trainer.version, "pid": os.getpid(),
                "rank": self.shard.rank, "spread_reference": self.trainer.spread_reference}

    @ray.method(concurrency_group="republish")
    def ensure_published(self) -> list[str]:
        """Re-send the newest snapshot to services that lost it (restarted); their node ids. A group of its
        own: a service fed through the object store pulls the snapshot back through `snapshot` ("sync")
        while this waits for it, and the default group may be busy regenerating."""
        return self.publisher.republish()

    def add_services(self, services: dict[str, Any]) -> list[str]:
        """Rank 0: publish to these nodes' weight-sync services too (nodes that joined after the start), the
        newest snapshot at once; their node ids. In the default group: the services pull it through
        `snapshot`, which the "sync" group must be free to answer."""
        self.publisher.services.update(services)
        return self.publisher.republish()

    def regenerate(self, iteration: int, group: RankedGroup) -> float:
        """Streamed regeneration: select and regenerate one slot's kept seeds now, while the other slots
        are explored; `train` uses the result. Seconds spent."""
        return self.trainer.stream(iteration, group)

    def train(self, iteration: int, groups: list[RankedGroup]) -> TrainResult:
        """select → regenerate → advantages → update → soft-update on the explorers' ranked groups (slots
        already streamed through `regenerate` with exactly these groups are not regenerated again)."""
        if iteration != self.trainer.iteration:
            raise ValueError(f"learner is at iteration {self.trainer.iteration}, asked to train {iteration}")
        start = time.perf_counter()
        result = self.trainer.train_iteration(iteration, groups)
        # idle: waiting for explorers between two updates (streamed regeneration is work, not waiting)
        self._busy_since = start - result.streamed_rollout_s
        self._idle = max(self._busy_since - self._last_end, 0.0) if self._last_end is not None else 0.0
        return result

    def finish_iteration(self) -> Finished:
        """After `train` and `publish`: the evaluation when due; the learner's idle fraction (busy: this
        update, its evaluation included)."""
        finished = self.trainer.finish_iteration()
        self._last_end = time.perf_counter()
        finished.learner_idle_fraction = self._idle / max(self._idle + self._last_end - self._busy_since, 1e-9)
        return finished

    def checkpoint(self) -> None:
        """Rank 0, when due: after the driver wrote the iteration's record."""
        self.trainer.checkpoint()

    def save_final(self, folder: str) -> dict[str, str]:
        return self.trainer.save_final(Path(folder))

    def evaluate(self) -> dict[str, float]:
        return self.trainer.evaluate()

    def evaluate_base(self) -> tuple[dict[str, float], GridSamples | None]:
        """The base model's held-out reward (a fresh run, before any update), with the experiment log's grid."""
        return self.trainer.base_evaluation()

    def sample_images(self, seeds_per_prompt: int = 6, base: bool = False) -> torch.Tensor:
        return self.trainer.sample_images(seeds_per_prompt, base=base)
