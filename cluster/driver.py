"""The driver loop: explorers rank seeds, the learner trains and publishes, repeat.

    for iteration i:   prompts(i) → one slot per prompt → explorers (round robin)
                       ← ranked groups (seeds + proxy rewards, a few KB each), each streamed at once to
                       learner[slot mod L].regenerate(i, group)  select → regenerate it while others explore
                       every rank: train(i, groups)  (its slots not streamed) → update → new policy version
                       every rank: publish()         rank 0: θ_old → every node's weight-sync service
                       every rank: finish_iteration  rank 0: evaluate when due, log, checkpoint
A learner group of L ranks shares each update through torch.distributed (`learner.data_parallel`); a
rank that dies ends the job at once with `LearnerDied` (resumable), not a hang in a collective.
Sync mode (the paper): iteration i's slots are explored with the policy of version v_i, the learner's.
Async mode: while the learner trains on i, explorers already explore i + 1 with version v_i — exactly
that version (the services keep the last two), so an async run is as reproducible as a sync one.
Groups more than `max_policy_lag` versions old are dropped (counted) and explored again. The learner
regenerates the kept seeds with its current sampling policy, so training data stay on-policy: only
the choice of seeds is stale.

Faults: a slot lost with an explorer is sent again after a backoff (0.5 s doubling to 8 s) to the
next explorer in turn — with one explorer, the same one once it has restarted — until
`cluster.explorers.restart_timeout_s`. Derived seeds and the pinned version make a retry give the
same group. An explorer that dies `cluster.explorers.max_crashes` times in a row without finishing a
slot is in a crash loop: the job ends with `ExplorerCrashLoop`, which names it (the run resumes
from its last checkpoint).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.explorer import Explorer
from actors.identity import actor_name, job_namespace, run_label
from actors.learner import Learner
from actors.reward_scorer import RewardScorer
from cluster.config import SolRLConfig
from cluster.control import read_control
from cluster.learner_group import JobFailed, on_learners, wait_learners
from diffusion.progress import Progress
from diffusion.prompts import load_prompts
from learner.algorithms import ALGORITHMS
from learner.data_parallel import owner_of
from learner.rollouts import exploration_sampling
from learner.run_log import progress_line
from learner.trainer import prompts_for
from weight_sync.service import start_services, stop_services

HEALTH_CHECK_S = 5.0  # a gather that sees no result this long makes sure every sync service holds the newest
BACKOFF_S = (0.5, 8.0)  # first wait before re-sending a lost slot, and the cap of its doubling
# Ray's words for a task sent to an actor that is still restarting: a wait, not another death.
RESTARTING = "actor is restarting"


class ExplorerCrashLoop(JobFailed):
    """An explorer keeps dying: retrying would never end."""


@dataclass
class Job:
    learners: list[Any]  # the learner group's ranks; rank 0 publishes, checkpoints and answers queries
    explorers: list[Any]
    placement: Any
    run: str = ""  # the `run` label of its metrics (`actors.identity`)
    namespace: str | None = None  # every actor of the job is named in it
    next_explorer: int = 0  # the next explorer's index: never reused, so never a name Ray has not freed yet
    services: dict[str, Any] | None = None
    scorers: list[Any] | None = None
    bundles: list[int | None] = field(default_factory=list)  # each explorer's placement bundle (None: outside)
    free_bundles: list[int] = field(default_factory=list)  # explorer bundles left by removed explorers
    # ready ref → a loading explorer: (actor, bundle, when it was asked for)
    joining: dict[Any, tuple[Any, int | None, float]] = field(default_factory=dict)
    unplaced_at: int | None = None  # a target whose joiner found no room: not retried until the target changes

    @property
    def learner(self) -> Any:
        return self.learners[0] if self.learners else None


@dataclass
class RetryPolicy:
    max_crashes: int = 3
    timeout_s: float = 900.0


@dataclass
class Task:
    """One slot's explore call in flight."""

    slot: int
    prompt: str
    explorer: int
    seq: int  # dispatch order: which incarnation of its explorer it could have reached
    tries: int = 0
    first_failure: float | None = None


@dataclass
class Health:
    """Deaths per explorer, so that one crash (which fails every slot queued on it) counts once."""

    deaths: dict[int, int] = field(default_factory=dict)  # in a row, since its last finished slot
    mark: dict[int, int] = field(default_factory=dict)  # tasks dispatched up to here met that death
    seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def start(config: SolRLConfig, run_dir: str | None, resume: bool | str) -> Job:
    """Weight-sync services (one per node, private to this job), a placement group, L learner ranks joined in
    one process group, E explorers and S scorers. If any of it fails, what was started is stopped again."""
    c = config.cluster
    tag = uuid.uuid4().hex[:8]
    # The namespace is also the metrics' `run` label: unique per job, where two run directories may share a name.
    run = namespace = job_namespace(run_label(run_dir, config.run.name), tag)
    job = Job(learners=[], explorers=[], placement=None, run=run, namespace=namespace,
              services=start_services(tag=tag, namespace=namespace))
    try:
        job.placement = pg = placement_group(
            [{k: v for k, v in b.items() if v} or {"CPU": 0.01} for b in c.bundles()], strategy=c.placement_strategy)
        try:
            ray.get(pg.ready(), timeout=600)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the job's {len(c.bundles())} actors (CPU {c.total('CPU'):g}, GPU "
                               f"{c.total('GPU'):g} in all) found no room within 600 s; the cluster has "
                               f"{ray.cluster_resources()}: run python -m cluster.check, or lower "
                               "cluster.*.count / num_cpus / num_gpus") from None

        def place(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)

        job.scorers = [
            ray.remote(RewardScorer).options(
                name=actor_name("scorer", i), namespace=namespace,
                num_cpus=c.scorers.num_cpus, num_gpus=c.scorers.num_gpus, max_restarts=-1, max_task_retries=-1,
                scheduling_strategy=place(c.learner.count + c.explorers.count + i),
            ).remote(config.reward, max_batch=c.scorers.max_batch, max_wait_ms=c.scorers.max_wait_ms,
                     threads=c.scorers.threads, index=i, run=run)
            for i in range(c.scorers.count)
        ]
        # One call at a time, in the driver's order (they share the model); "sync": snapshot pulls during train.
        job.learners = [
            ray.remote(concurrency_groups={"sync": 1})(Learner).options(
                name=actor_name("learner", rank), namespace=namespace, num_cpus=c.learner.num_cpus,
                num_gpus=c.learner.num_gpus, scheduling_strategy=place(rank), max_concurrency=1,
            ).remote(config, run_dir, job.services, resume=resume, codec=c.codec, threads=c.learner.threads,
                     scorers=job.scorers or None, rank=rank, world=c.learner.count, run=run)
            for rank in range(c.learner.count)
        ]
        if c.learner.count > 1:
            address = ray.get(job.learner.address.remote())
            on_learners(job.learners, "join", address, c.learner.collective_timeout_s)
        for i in range(c.explorers.count):
            job.explorers.append(new_explorer(job, config, c.learner.count + i))
            job.bundles.append(c.learner.count + i)
    except BaseException:
        stop(job)
        raise
    return job


def new_explorer(job: Job, config: SolRLConfig, bundle: int | None) -> Any:
    """An explorer actor in placement bundle `bundle` (None: wherever Ray finds room)."""
    c = config.cluster
    strategy = None if bundle is None else PlacementGroupSchedulingStrategy(
        placement_group=job.placement, placement_group_bundle_index=bundle)
    index, job.next_explorer = job.next_explorer, job.next_explorer + 1
    return ray.remote(Explorer).options(
        name=actor_name("explorer", index), namespace=job.namespace, num_cpus=c.explorers.num_cpus,
        num_gpus=c.explorers.num_gpus, scheduling_strategy=strategy,
        max_restarts=-1, max_task_retries=0,  # the driver re-dispatches lost slots itself
    ).remote(config.model, config.explore, config.reward, job.services, sampling=exploration_sampling(config),
             run_seed=config.run.seed, candidates=config.prompts.candidates, threads=c.explorers.threads,
             scorers=job.scorers or None, prompt_source=config.prompts.source, index=index, run=job.run)


def _missing_room(config: SolRLConfig) -> str:
    """What one more explorer needs against what the cluster has free, for the log."""
    e, free = config.cluster.explorers, ray.available_resources()
    return (f"one needs CPU {e.num_cpus:g}, GPU {e.num_gpus:g}; the cluster has CPU {free.get('CPU', 0):g}, "
            f"GPU {free.get('GPU', 0):g} free")


def resize_explorers(job: Job, config: SolRLConfig, target: int, health: Health,
                     log: Callable[[str], None]) -> dict[str, int]:
    """Move toward `target` explorers (`cluster.control`, at most `cluster.explorers.max`); call only while no
    slot is in flight. New ones load in the background and join here once ready; one that is not placed and
    loaded within `cluster.explorers.join_timeout_s` is stopped and reported with the missing resources (and
    that target is not retried until the control file asks for another). Removed ones (still loading ones
    first, then the newest) stop now. Seeds are derived, so who explores a slot changes nothing."""
    before, e = len(job.explorers), config.cluster.explorers
    if target != job.unplaced_at:
        job.unplaced_at = None
    ready = ray.wait(list(job.joining), num_returns=len(job.joining), timeout=0)[0] if job.joining else []
    for ref in ready:
        actor, bundle, _ = job.joining.pop(ref)
        try:
            ray.get(ref)
        except RayActorError as exc:  # it could not start: its bundle goes back, the next read retries
            log(f"a new explorer failed to start: {str(exc).splitlines()[0]}")
            if bundle is not None:
                job.free_bundles.append(bundle)
            continue
        job.explorers.append(actor)
        job.bundles.append(bundle)
    now = time.monotonic()
    for ref, (actor, bundle, since) in list(job.joining.items()):
        if now - since > e.join_timeout_s:  # never placed (no room) or never loaded: not left "joining"
            log(f"a new explorer was not placed and loaded within {e.join_timeout_s:g} s "
                f"(cluster.explorers.join_timeout_s): {_missing_room(config)}; staying at "
                f"{len(job.explorers) + len(job.joining) - 1} explorer(s) — add nodes, or ask for fewer")
            del job.joining[ref]
            ray.kill(actor, no_restart=True)
            if bundle is not None:
                job.free_bundles.append(bundle)
            job.unplaced_at = target
    wanted = len(job.explorers) + len(job.joining) if job.unplaced_at is not None else target
    while len(job.explorers) + len(job.joining) < wanted:
        bundle = job.free_bundles.pop(0) if job.free_bundles else None
        actor = new_explorer(job, config, bundle)
        job.joining[actor.pid.remote()] = (actor, bundle, now)
    while job.joining and len(job.explorers) + len(job.joining) > target:
        actor, bundle, _ = job.joining.pop(next(reversed(job.joining)))
        ray.kill(actor, no_restart=True)
        if bundle is not None:
            job.free_bundles.append(bundle)
    while len(job.explorers) > max(target, 1):
        ray.kill(job.explorers.pop(), no_restart=True)
        bundle = job.bundles.pop()
        if bundle is not None:
            job.free_bundles.append(bundle)
        health.deaths.pop(len(job.explorers), None)  # the index may be reused by a new explorer
        health.mark.pop(len(job.explorers), None)
    if len(job.explorers) != before:
        log(f"explorers {before} → {len(job.explorers)}" + (f" ({len(job.joining)} loading)" if job.joining else ""))
    return {"explorers": len(job.explorers), "explorers_joining": len(job.joining)}


def dispatch(job: Job, iteration: int, slots: list[tuple[int, str]], version: int,
             health: Health | None = None) -> dict:
    """One explore task per (slot, prompt), spread round robin; pending ref → Task."""
    health = health or Health()
    pending = {}
    for slot, prompt in slots:
        e = slot % len(job.explorers)
        pending[job.explorers[e].explore.remote(iteration, slot, prompt, version)] = Task(
            slot, prompt, e, health.next_seq())
    return pending


def gather(job: Job, iteration: int, pending: dict, version: int, stats: dict,
           retry: RetryPolicy | None = None, health: Health | None = None,
           on_group: Callable[[Any], None] | None = None) -> list:
    """Wait for every slot's ranked group; a slot whose explorer died is sent again after a backoff.
    `on_group(group)` runs as each group arrives (streamed regeneration)."""
    retry, health = retry or RetryPolicy(), health or Health()
    groups: dict[int, Any] = {}
    waiting: list[tuple[float, Task]] = []  # (when to re-send, task)
    while pending or waiting:
        now = time.monotonic()
        for due, task in [w for w in waiting if w[0] <= now]:
            waiting.remove((due, task))
            task.explorer = (task.slot + task.tries) % len(job.explorers)
            task.seq = health.next_seq()
            ref = job.explorers[task.explorer].explore.remote(iteration, task.slot, task.prompt, version)
            pending[ref] = task
            stats["explorer_retries"] = stats.get("explorer_retries", 0) + 1
        if not pending:
            time.sleep(max(0.0, min(due for due, _ in waiting) - time.monotonic()))
            continue
        timeout = min([HEALTH_CHECK_S] + [max(0.0, due - now) for due, _ in waiting])
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if not ready:
            if not waiting and job.learner is not None:  # explorers may wait for a snapshot a restarted
                ray.get(job.learner.ensure_published.remote())  # sync service lost
            continue
        task = pending.pop(ready[0])
        try:
            groups[task.slot] = ray.get(ready[0])
            health.deaths[task.explorer] = 0
            if on_group is not None:
                on_group(groups[task.slot])
        except RayActorError as exc:
            now = time.monotonic()
            restarting = RESTARTING in str(exc)
            if not restarting and task.seq > health.mark.get(task.explorer, 0):
                health.deaths[task.explorer] = health.deaths.get(task.explorer, 0) + 1
                health.mark[task.explorer] = health.seq
                stats["explorer_deaths"] = stats.get("explorer_deaths", 0) + 1
                if health.deaths[task.explorer] >= retry.max_crashes:
                    raise ExplorerCrashLoop(
                        f"explorer {task.explorer} died {health.deaths[task.explorer]} times in a row without "
                        f"finishing a slot (iteration {iteration}, last slot {task.slot}: {task.prompt!r}); its "
                        "log is in the Ray dashboard (Actors → solrl-explorer-<i>) and the job's logs") from exc
            task.first_failure = task.first_failure or now
            if now - task.first_failure > retry.timeout_s:
                raise ExplorerCrashLoop(
                    f"slot {task.slot} of iteration {iteration} found no live explorer for "
                    f"{now - task.first_failure:.0f} s (cluster.explorers.restart_timeout_s); last error: "
                    f"{str(exc).splitlines()[0]}") from exc
            task.tries += 1
            delay = min(BACKOFF_S[0] * 2 ** (task.tries - 1), BACKOFF_S[1])
            stats["explorer_wait_s"] = stats.get("explorer_wait_s", 0.0) + delay
            waiting.append((now + delay, task))
    return [groups[s] for s in sorted(groups)]


def run(config: SolRLConfig, run_dir: str | None, *, resume: bool | str = False, log: Callable[[str], None] = print,
        on_iteration: Callable[[Job, dict[str, Any]], None] | None = None,
        on_start: Callable[[Job, dict[str, Any]], None] | None = None,
        evaluate_base: bool = False) -> tuple[Job, list[dict[str, Any]]]:
    """Run to config.run.iterations; `on_start(job, status)` once the learner is up (and resumed),
    `on_iteration(job, metrics)` after each iteration (tests inject faults there). With evaluate_base,
    a fresh run first logs the base model's held-out reward. On an error the job's actors are stopped."""
    job = start(config, run_dir, resume)
    try:
        return job, _loop(job, config, run_dir, log, on_iteration, on_start, evaluate_base)
    except BaseException:
        stop(job)
        raise


def _loop(job: Job, config: SolRLConfig, run_dir: str | None, log: Callable[[str], None],
          on_iteration: Callable[[Job, dict[str, Any]], None] | None,
          on_start: Callable[[Job, dict[str, Any]], None] | None, evaluate_base: bool) -> list[dict[str, Any]]:
    tick = time.perf_counter()
    log(f"loading the model into {len(job.learners)} learner(s), {len(job.explorers)} explorer(s)"
        + (f", {len(job.scorers)} scorer(s)" if job.scorers else "") + f" (Ray namespace {job.namespace})")
    status = on_learners(job.learners, "start")[0]
    ray.get([e.pid.remote() for e in job.explorers])
    actors = {"learner": job.learners, "explorer": job.explorers, "scorer": job.scorers or []}
    log(f"actors ready in {time.perf_counter() - tick:.0f} s: " + ", ".join(
        f"{actor_name(role, 0)}..{len(handles) - 1}" for role, handles in actors.items() if handles))
    on_learners(job.learners, "publish")  # the (resumed) sampling policy, before anything is explored
    if on_start is not None:
        on_start(job, status)
    if evaluate_base and status["iteration"] == 0:
        e = config.eval
        log(f"evaluating the base model: {e.prompts} held-out prompts × {e.seeds_per_prompt} seeds, {e.steps} steps")
        base = on_learners(job.learners[:1], "evaluate_base")[0]  # rank 0 evaluates; its death is LearnerDied
        log("base model   held-out " + "  ".join(f"{k.removeprefix('eval_')} {v:.3f}" for k, v in base.items()))
    version, history = status["version"], []
    asynchronous, lag = config.cluster.mode == "async", config.cluster.max_policy_lag
    retry = RetryPolicy(config.cluster.explorers.max_crashes, config.cluster.explorers.restart_timeout_s)
    health = Health()
    prompt_set = load_prompts(config.prompts.source)
    stream_regeneration = config.cluster.stream_regeneration and ALGORITHMS[config.learner.algorithm].remote_explore

    def prompts(iteration: int) -> list[str]:  # a pure function: no need to ask the (busy) learner
        return prompts_for(prompt_set, config.run.seed, iteration, config.prompts.per_iteration)

    target, unreadable, limit = config.cluster.explorers.count, None, config.cluster.explorers.limit
    refused: int | None = None

    def steer() -> dict[str, int]:  # the control file, read while no slot is in flight
        nonlocal target, unreadable, refused
        if run_dir is not None:
            try:
                asked = read_control(run_dir).explorers or target
            except ValueError as exc:
                if str(exc) != unreadable:
                    log(f"ignoring the control file: {exc}")
                unreadable, asked = str(exc), target
            if asked > limit and asked != refused:  # a file written by hand: cluster.control refuses this
                log(f"the control file asks for {asked} explorers; the job has room for {limit} "
                    f"(cluster.explorers.max): running {limit}; resume with --set cluster.explorers.max={asked}")
            refused = asked if asked > limit else None
            target = min(asked, limit)
        return resize_explorers(job, config, target, health, log)

    prefetched: tuple[dict, int] | None = None  # async: the next iteration's tasks and their version
    progress = Progress("iteration", config.run.iterations, done=status["iteration"])
    for iteration in range(status["iteration"], config.run.iterations):
        stats: dict[str, Any] = {}
        tick = time.perf_counter()
        ray.get(job.learner.ensure_published.remote())  # a restarted sync service gets the newest again
        slots = list(enumerate(prompts(iteration)))
        if prefetched is None:
            stats.update(steer())
        streamed: dict[ray.ObjectRef, int] = {}  # → the rank regenerating

        def stream(group, iteration=iteration, version=version, streamed=streamed) -> None:  # while others explore
            if stream_regeneration and not (asynchronous and version - group.policy_version > lag):
                rank = owner_of(group.slot, len(job.learners))
                streamed[job.learners[rank].regenerate.remote(iteration, group)] = rank

        pending, explored_with = prefetched or (dispatch(job, iteration, slots, version, health), version)
        groups = gather(job, iteration, pending, explored_with, stats, retry, health, on_group=stream)
        if asynchronous:  # drop groups explored with a policy more than `lag` versions old; explore again
            stale = [g.slot for g in groups if version - g.policy_version > lag]
            if stale:
                stats["dropped_groups"] = len(stale)
                again = dispatch(job, iteration, [slots[s] for s in stale], version, health)
                fresh = {g.slot: g for g in gather(job, iteration, again, version, stats, retry, health,
                                                   on_group=stream)}
                groups = [fresh.get(g.slot, g) if g.slot in stale else g for g in groups]
        waited = time.perf_counter() - tick
        explore_s = max(g.seconds for g in groups) if groups else 0.0
        stats.update({"explore_s": explore_s, "explore_wall_s": waited,
                      "explore_busy_s": sum(g.seconds for g in groups),  # all explorers' sampling seconds
                      "policy_lag": max((version - g.policy_version for g in groups), default=0),
                      "candidates_per_second": sum(len(g.seeds) for g in groups) / max(waited, 1e-9)})
        wait_learners(job.learners, streamed, "regenerate")  # a streamed regeneration's error surfaces here
        prefetched = None
        if asynchronous and iteration + 1 < config.run.iterations:  # explorers run ahead while the group trains
            stats.update(steer())
            nxt = list(enumerate(prompts(iteration + 1)))
            prefetched = (dispatch(job, iteration + 1, nxt, version, health), version)
        metrics = {**on_learners(job.learners, "train", iteration, groups)[0], **stats}
        published = on_learners(job.learners, "publish")[0]  # the new θ_old to every node
        metrics.update(sync_s=published["sync_s"], sync_bytes=published.get("sync_bytes", 0.0))
        metrics = on_learners(job.learners, "finish_iteration", metrics)[0]
        metrics["iteration_wall_s"] = time.perf_counter() - tick  # dispatch → finished, as the driver saw it
        version = metrics["policy_version"]
        history.append(metrics)
        log(progress_line(metrics, progress))
        if on_iteration is not None:
            on_iteration(job, metrics)
    return history


def stop(job: Job) -> None:
    """End the job's actors, its weight-sync services (their snapshots with them) and its placement."""
    for actor in [*job.learners, *job.explorers, *(a for a, *_ in job.joining.values()), *(job.scorers or [])]:
        if actor is not None:
            ray.kill(actor, no_restart=True)
    if job.services:  # after their readers and writer: each unlinks its shared-memory region now
        stop_services(job.services)
    if job.placement is not None:
        remove_placement_group(job.placement)
