"""The driver loop: explorers rank seeds, the learner trains and publishes, repeat.

    for iteration i:   prompts(i) → one slot per prompt → explorers (round robin)
                       ← ranked groups (seeds + proxy rewards, a few KB each)
                       learner.train(i, groups) → update → new policy version → weight-sync services
Sync mode (the paper): iteration i's slots are explored with the policy of version i.
Async mode: while the learner trains on i, explorers already explore i + 1 with the version they hold;
groups more than `max_policy_lag` versions old are dropped (counted) and explored again. The learner
regenerates the kept seeds with its current sampling policy, so training data stay on-policy: only
the choice of seeds is stale. Slots lost with a dead explorer are re-dispatched; derived seeds make a
retry give the same group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.explorer import Explorer
from actors.learner import Learner
from actors.reward_scorer import RewardScorer
from cluster.config import SolRLConfig
from diffusion.prompts import load_prompts
from learner.trainer import progress_line, prompts_for
from weight_sync.service import start_services

MAX_ATTEMPTS = 5
HEALTH_CHECK_S = 5.0  # a gather that sees no result this long makes sure every sync service holds the newest


@dataclass
class Job:
    learner: Any
    explorers: list[Any]
    placement: Any
    services: dict[str, Any] | None = None
    scorers: list[Any] | None = None


def start(config: SolRLConfig, run_dir: str | None, resume: bool) -> Job:
    """Weight-sync services (one per node), a placement group, the learner and E explorers."""
    services = start_services()
    c = config.cluster
    bundles = [{"CPU": c.learner.num_cpus, "GPU": c.learner.num_gpus}] + [
        {"CPU": c.explorers.num_cpus, "GPU": c.explorers.num_gpus} for _ in range(c.explorers.count)] + [
        {"CPU": c.scorers.num_cpus, "GPU": c.scorers.num_gpus} for _ in range(c.scorers.count)]
    pg = placement_group([{k: v for k, v in b.items() if v} or {"CPU": 0.01} for b in bundles],
                         strategy=c.placement_strategy)
    ray.get(pg.ready(), timeout=600)

    def place(i: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)

    learner = ray.remote(Learner).options(  # max_concurrency 2: services pull snapshots during `train`
        num_cpus=c.learner.num_cpus, num_gpus=c.learner.num_gpus, scheduling_strategy=place(0), max_concurrency=2,
    ).remote(config, run_dir, resume=resume, codec=c.codec, threads=c.learner.threads)
    scorers = [
        ray.remote(RewardScorer).options(
            num_cpus=c.scorers.num_cpus, num_gpus=c.scorers.num_gpus, max_restarts=-1, max_task_retries=-1,
            scheduling_strategy=place(1 + c.explorers.count + i),
        ).remote(config.reward, threads=c.scorers.threads)
        for i in range(c.scorers.count)
    ]
    explorers = [
        ray.remote(Explorer).options(
            num_cpus=c.explorers.num_cpus, num_gpus=c.explorers.num_gpus, scheduling_strategy=place(i + 1),
            max_restarts=-1, max_task_retries=0,  # the driver re-dispatches lost slots itself
        ).remote(config.model, config.explore, config.reward, run_seed=config.run.seed,
                 candidates=config.prompts.candidates, threads=c.explorers.threads, scorers=scorers or None)
        for i in range(c.explorers.count)
    ]
    return Job(learner, explorers, pg, services, scorers)


def dispatch(job: Job, iteration: int, slots: list[tuple[int, str]], min_version: int) -> dict:
    """One explore task per (slot, prompt), spread round robin; pending ref → (slot, prompt, attempt)."""
    return {job.explorers[slot % len(job.explorers)].explore.remote(iteration, slot, prompt, min_version):
            (slot, prompt, 0) for slot, prompt in slots}


def gather(job: Job, iteration: int, pending: dict, min_version: int, stats: dict) -> list:
    """Wait for every slot's ranked group; a slot whose explorer died goes to the next explorer."""
    groups: dict[int, Any] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEALTH_CHECK_S)
        if not ready:  # explorers may be waiting for a snapshot a restarted sync service lost
            if job.learner is not None:
                ray.get(job.learner.ensure_published.remote())
            continue
        slot, prompt, attempt = pending.pop(ready[0])
        try:
            groups[slot] = ray.get(ready[0])
        except (RayActorError, ActorUnavailableError):
            if attempt + 1 >= MAX_ATTEMPTS:
                raise
            explorer = job.explorers[(slot + attempt + 1) % len(job.explorers)]
            pending[explorer.explore.remote(iteration, slot, prompt, min_version)] = (slot, prompt, attempt + 1)
            stats["redispatched_slots"] = stats.get("redispatched_slots", 0) + 1
    return [groups[s] for s in sorted(groups)]


def run(config: SolRLConfig, run_dir: str | None, *, resume: bool = False, log: Callable[[str], None] = print,
        on_iteration: Callable[[Job, dict[str, Any]], None] | None = None,
        evaluate_base: bool = False) -> tuple[Job, list[dict[str, Any]]]:
    """Run to config.run.iterations; `on_iteration(job, metrics)` is called after each (tests inject faults).
    With evaluate_base, a fresh run first logs the base model's held-out reward."""
    job = start(config, run_dir, resume)
    status = ray.get(job.learner.start.remote())
    if evaluate_base and status["iteration"] == 0:
        base = ray.get(job.learner.evaluate.remote())
        log("base model   held-out " + "  ".join(f"{k.removeprefix('eval_')} {v:.3f}" for k, v in base.items()))
    version, history = status["version"], []
    asynchronous, lag = config.cluster.mode == "async", config.cluster.max_policy_lag
    prompt_set = load_prompts(config.prompts.source)

    def prompts(iteration: int) -> list[str]:  # a pure function: no need to ask the (busy) learner
        return prompts_for(prompt_set, config.run.seed, iteration, config.prompts.per_iteration)

    prefetched: dict | None = None
    for iteration in range(status["iteration"], config.run.iterations):
        stats: dict[str, Any] = {}
        tick = time.perf_counter()
        ray.get(job.learner.ensure_published.remote())  # a restarted sync service gets the newest again
        slots = list(enumerate(prompts(iteration)))
        pending = prefetched if prefetched is not None else dispatch(job, iteration, slots, version)
        groups = gather(job, iteration, pending, version, stats)
        if asynchronous:  # drop groups explored with a policy more than `lag` versions old; explore again
            stale = [g.slot for g in groups if version - g.policy_version > lag]
            if stale:
                stats["dropped_groups"] = len(stale)
                again = dispatch(job, iteration, [slots[s] for s in stale], version)
                fresh = {g.slot: g for g in gather(job, iteration, again, version, stats)}
                groups = [fresh.get(g.slot, g) if g.slot in stale else g for g in groups]
        waited = time.perf_counter() - tick
        explore_s = max(g.seconds for g in groups) if groups else 0.0
        stats.update({"explore_seconds": explore_s, "explore_wall_s": waited,
                      "policy_lag": max((version - g.policy_version for g in groups), default=0),
                      "candidates_per_second": sum(len(g.seeds) for g in groups) / max(waited, 1e-9)})
        train_ref = job.learner.train.remote(iteration, groups, stats)
        prefetched = None
        if asynchronous and iteration + 1 < config.run.iterations:
            prefetched = dispatch(job, iteration + 1, list(enumerate(prompts(iteration + 1))), version)
        metrics = ray.get(train_ref)
        version = metrics["policy_version"]
        history.append(metrics)
        log(progress_line(metrics))
        if on_iteration is not None:
            on_iteration(job, metrics)
    return job, history


def stop(job: Job) -> None:
    """End the job's actors, its weight-sync services (their snapshots with them) and its placement."""
    for actor in [job.learner, *job.explorers, *(job.scorers or []), *(job.services or {}).values()]:
        ray.kill(actor, no_restart=True)
    remove_placement_group(job.placement)
