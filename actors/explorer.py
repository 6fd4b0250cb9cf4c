"""Explorer actor: a low-precision rollout engine and a co-located reward, on its own GPU (or CPU).

It turns prompt slots into ranked groups — (seed, proxy reward) pairs — with the very function the
single-process trainer uses (`learner.rollouts.explore_group`); images never leave it. Before each
slot it makes sure its engine holds at least the policy version the driver asks for, fetching it from
its node's weight-sync service. Restartable: a restarted explorer re-runs __init__, reloads the model
and the newest weights, and a retried slot gives the same result (seeds are derived, not drawn).
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray
import torch

from actors.identity import actor_name
from actors.metrics import ExplorerMetrics
from actors.reward_scorer import RemoteReward
from diffusion.config import ExploreConfig, ModelConfig
from diffusion.explore import ExploreEngine
from diffusion.loading import load_policy_from_config
from diffusion.noise import candidate_seeds
from diffusion.prompts import load_prompt_set
from learner.rollouts import RankedGroup, Sampling, explore_group
from rewards import build_reward_from_config
from rewards.config import RewardConfig
from weight_sync.service import find_service
from weight_sync.subscriber import WeightSubscriber

SERVICE_WAIT_S = 120.0  # for a node that joined after the start: the driver starts its service within seconds


class Explorer:
    def __init__(self, model: ModelConfig, explore: ExploreConfig, reward: RewardConfig, services: dict[str, Any],
                 *, sampling: Sampling, run_seed: int, candidates: int, threads: int = 1,
                 scorers: list | None = None, prompt_source: str = "embedded", index: int = 0,
                 run: str = "") -> None:
        """`services`: node id → that node's WeightSyncService (this job's own); this explorer reads its
        node's. `sampling`: the explore pass (`learner.rollouts.exploration_sampling`). `prompt_source`:
        the training prompt set, loaded here too, so only prompt texts travel and the reward still gets
        each prompt's metadata. `index`, `run`: its name and metric labels (`actors.identity`)."""
        self.name = actor_name("explorer", index)
        torch.set_num_threads(threads)
        self.sampling, self.run_seed, self.candidates = sampling, run_seed, candidates
        self.prompt_set = load_prompt_set(prompt_source)
        self.policy = load_policy_from_config(model)
        # The engine is the policy's own transformer, quantized in place: the explorer samples only through
        # it, so it holds one transformer, not the policy's and a copy (the lora codec's base weights are
        # copied by the subscriber, of the adapted layers only).
        self.engine = ExploreEngine(self.policy, explore, in_place=True)
        # What this explorer really runs (real FP8/NVFP4 GEMMs or an emulation), in its log for the dashboard.
        print(f"{self.name}: explore engine {self.engine.plan.summary}", flush=True)
        self.reward = RemoteReward(scorers, reward) if scorers else build_reward_from_config(reward)
        node = ray.get_runtime_context().get_node_id()
        # A node that joined after the job started (this explorer restarted there) gets its service from the
        # driver soon after; the handles given at the start do not name it.
        service = services.get(node) or find_service(node, namespace=run, wait_s=SERVICE_WAIT_S)
        if service is None:
            raise RuntimeError(f"no weight-sync service on node {node} within {SERVICE_WAIT_S:g} s: the driver "
                               "starts one for each node that joins; is the driver alive?")
        self.subscriber = WeightSubscriber(service, self.engine)
        self.metrics = ExplorerMetrics(run, index)

    def __repr__(self) -> str:  # Ray's log prefix and the dashboard's name for it
        return getattr(self, "name", "solrl-explorer")

    def sync(self, version: int, timeout_s: float = 900.0) -> int:
        """Hold exactly policy `version`, waiting for it to arrive; if the service no longer keeps it
        (two newer ones came), the newest. Returns the version held."""
        deadline = time.monotonic() + timeout_s
        while self.subscriber.version != version:
            info = self.subscriber.fetch(version)
            if info is None and self.subscriber.newest > version:
                info = self.subscriber.poll()  # released: the group says which version ranked it
                if info is not None:
                    self.metrics.synced(info)
                return self.subscriber.version
            if info is not None:
                self.metrics.synced(info)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"policy version {version} did not arrive within {timeout_s:.0f} s")
            time.sleep(0.02)
        return self.subscriber.version

    def explore(self, iteration: int, slot: int, prompt: str, version: int,
                spread_reference: float | None = None) -> RankedGroup:
        """One slot's ranked group with policy `version`; `spread_reference`: the spread schedule's reference
        for `iteration`, which the driver sends with each request (None: every slot explores all N)."""
        version = self.sync(version)
        group = explore_group(
            self.policy, self.engine.module, self.reward, iteration=iteration, slot=slot, prompt=prompt,
            seeds=candidate_seeds(self.run_seed, iteration, slot, self.candidates), sampling=self.sampling,
            policy_version=version, metadata=self.prompt_set.metadata_of(prompt)[0],
            spread_reference=spread_reference,
        )
        self.metrics.explored(group)
        return group

    def pid(self) -> int:
        return os.getpid()
