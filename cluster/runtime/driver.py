"""The driver loop: explorers rank seeds, the learner trains and publishes, repeat.

    for iteration i:   explore   prompts(i) → one slot per prompt → the explorer pool (round robin)
                                 ← ranked groups (seeds + proxy rewards, a few KB each), each streamed at once
                                 to learner[slot mod L].regenerate(i, group) while the others explore
                       train     every rank: the update (its slots not streamed yet) → a TrainResult
                       publish   rank 0: θ_old → every node's weight-sync service
                       finish    every rank: the iteration counted; rank 0 evaluates when due
                       record    the driver: the iteration's record, written once (`learner.run_log.RunLog`)
                       checkpoint rank 0, when due: after the record, so a resumed run never lacks a line
A learner group of L ranks shares each update through torch.distributed (`learner.data_parallel`); a
rank that dies ends the job at once with `LearnerDied` (resumable), not a hang in a collective.
Sync mode (the paper): iteration i's slots are explored with the policy of version v_i, the learner's.
Async mode: while the learner trains on i, explorers already explore i + 1 with version v_i — exactly
that version (the services keep the last two), so an async run is as reproducible as a sync one.
Groups more than `max_policy_lag` versions old are dropped (counted) and explored again. The learner
regenerates the kept seeds with its current sampling policy, so training data stay on-policy: only
the choice of seeds is stale. Explorer faults and resizing are the pool's (`cluster.runtime.explorer_pool`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.explorer import Explorer
from actors.identity import actor_name, job_namespace, run_label
from actors.learner import Learner
from actors.metrics import LearnerMetrics
from actors.reward_scorer import RewardScorer
from cluster.config.schema import SolRLConfig
from cluster.runtime.control_file import ControlTarget, hold_if_asked
from cluster.runtime.explorer_pool import Batch, ExplorerPool, RetryPolicy
from cluster.runtime.learner_group import join_group, on_learners, wait_learners
from diffusion.noise import iteration_prompts
from diffusion.progress import Progress
from diffusion.prompts import load_prompts
from learner.algorithms import ALGORITHMS
from learner.data_parallel import owner_of
from learner.iteration_record import IterationRecord, Work
from learner.rollouts import RankedGroup, exploration_sampling, spread_reference
from learner.run_log import RunLog, progress_line
from weight_sync.service import start_services, stop_services


@dataclass
class Job:
    learners: list[Any]  # the learner group's ranks; rank 0 publishes, checkpoints and answers queries
    pool: ExplorerPool | None
    placement: Any
    run: str = ""  # the `run` label of its metrics (`actors.identity`)
    namespace: str | None = None  # every actor of the job is named in it
    next_explorer: int = 0  # the next explorer's index: never reused, so never a name Ray has not freed yet
    services: dict[str, Any] | None = None
    tag: str = ""  # names the job's shared-memory regions (`weight_sync.service.start_services`)
    explorer_names: dict[Any, str] = field(default_factory=dict)  # actor handle → its name, for the log
    scorers: list[Any] | None = None
    log: RunLog | None = None  # the run's records, the resumed part included (set once the learner is up)
    gauges: LearnerMetrics | None = None  # the run's dashboard series, kept on the endpoint until `stop`

    @property
    def learner(self) -> Any:
        return self.learners[0] if self.learners else None

    @property
    def explorers(self) -> list[Any]:
        return self.pool.actors if self.pool is not None else []


def start(config: SolRLConfig, run_dir: str | None, resume: bool | str, log: Callable[[str], None] = print) -> Job:
    """Weight-sync services (one per node, private to this job), a placement group, L learner ranks joined in
    one process group, E explorers and S scorers. If any of it fails, what was started is stopped again."""
    c = config.cluster
    tag = uuid.uuid4().hex[:8]
    # The namespace is also the metrics' `run` label: unique per job, where two run directories may share a name.
    run = namespace = job_namespace(run_label(run_dir, config.run.name), tag)
    job = Job(learners=[], pool=None, placement=None, run=run, namespace=namespace,
              services=start_services(tag=tag, namespace=namespace), tag=tag)
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
        job.scorers = [
            ray.remote(RewardScorer).options(
                name=actor_name("scorer", i), namespace=namespace,
                num_cpus=c.scorers.num_cpus, num_gpus=c.scorers.num_gpus, max_restarts=-1, max_task_retries=-1,
                scheduling_strategy=_bundle(job, c.learner.count + c.explorers.count + i),
            ).remote(config.reward, max_batch=c.scorers.max_batch, max_wait_ms=c.scorers.max_wait_ms,
                     threads=c.scorers.threads, index=i, run=run)
            for i in range(c.scorers.count)
        ]
        # One call at a time, in the driver's order (they share the model); "sync": snapshot pulls during train;
        # "republish": re-sends to restarted services, which wait on those pulls.
        job.learners = [
            ray.remote(concurrency_groups={"sync": 1, "republish": 1})(Learner).options(
                name=actor_name("learner", rank), namespace=namespace, num_cpus=c.learner.num_cpus,
                num_gpus=c.learner.num_gpus, scheduling_strategy=_bundle(job, rank), max_concurrency=1,
            ).remote(config, run_dir, job.services, resume=resume, codec=c.codec, threads=c.learner.threads,
                     scorers=job.scorers or None, rank=rank, world=c.learner.count)
            for rank in range(c.learner.count)
        ]
        if c.learner.count > 1:
            address = ray.get(job.learner.address.remote())
            for line in join_group(job.learners, address, c.learner):
                log(line)
        bundles = [c.learner.count + i for i in range(c.explorers.count)]
        job.pool = ExplorerPool(
            [new_explorer(job, config, b) for b in bundles], bundles=bundles,
            spawn=lambda bundle: new_explorer(job, config, bundle),
            retry=RetryPolicy(c.explorers.max_crashes, c.explorers.restart_timeout_s),
            join_timeout_s=c.explorers.join_timeout_s, lost_after_s=c.explorers.lost_after_s,
            bundle_ready=lambda bundle: _bundle_ready(job, bundle), name_of=lambda actor: job.explorer_names[actor],
            on_idle=lambda: _serve_every_node(job, log),
            log=log)
    except BaseException:
        stop(job)
        raise
    return job


def _bundle(job: Job, index: int | None) -> PlacementGroupSchedulingStrategy | None:
    """Bundle `index` of the job's placement group (None: wherever Ray finds room)."""
    return None if index is None else PlacementGroupSchedulingStrategy(placement_group=job.placement,
                                                                       placement_group_bundle_index=index)


def new_explorer(job: Job, config: SolRLConfig, bundle: int | None) -> Any:
    """An explorer actor in placement bundle `bundle` (None: wherever Ray finds room)."""
    c = config.cluster
    index, job.next_explorer = job.next_explorer, job.next_explorer + 1
    actor = ray.remote(Explorer).options(
        name=actor_name("explorer", index), namespace=job.namespace, num_cpus=c.explorers.num_cpus,
        num_gpus=c.explorers.num_gpus, scheduling_strategy=_bundle(job, bundle),
        max_restarts=-1, max_task_retries=0,  # the pool re-dispatches lost slots itself
    ).remote(config.model, config.explore, config.reward, job.services, sampling=exploration_sampling(config),
             run_seed=config.run.seed, candidates=config.prompts.candidates, threads=c.explorers.threads,
             scorers=job.scorers or None, prompt_source=config.prompts.source, index=index, run=job.run)
    job.explorer_names[actor] = actor_name("explorer", index)
    return actor


def _bundle_ready(job: Job, bundle: int) -> bool:
    """Ray has placed `bundle` (again: its node may have left) on a node with a weight-sync service."""
    node = placement_group_table(job.placement)["bundles_to_node_id"].get(bundle, "")
    return bool(node) and node in job.services


def add_node_services(job: Job) -> list[str]:
    """Nodes that joined the cluster since the job started get a weight-sync service, and the learner
    publishes to it from now on (the newest snapshot at once), so an explorer can run there; their ids."""
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    if alive <= job.services.keys():
        return []
    # get_if_exists: the services the job has come back as they are; only the new nodes' are made
    new = {node: s for node, s in start_services(tag=job.tag, namespace=job.namespace).items()
           if node not in job.services}
    job.services.update(new)  # new explorers are given them
    ray.get(job.learner.add_services.remote(new))
    return list(new)


def _serve_every_node(job: Job, log: Callable[[str], None]) -> None:
    """When the explorers go quiet: nodes that joined get a service (an explorer restarted there waits for it),
    and services that restarted get the newest snapshot again."""
    for node in add_node_services(job):
        log(f"node {node[:8]} joined the cluster: its weight-sync service is up, explorers can run there")
    ray.get(job.learner.ensure_published.remote())


def _missing_room(config: SolRLConfig) -> str:
    """What one more explorer needs against what the cluster has free, for the log."""
    e, free = config.cluster.explorers, ray.available_resources()
    return (f"one needs CPU {e.num_cpus:g}, GPU {e.num_gpus:g}; the cluster has CPU {free.get('CPU', 0):g}, "
            f"GPU {free.get('GPU', 0):g} free")


def run(config: SolRLConfig, run_dir: str | None, *, resume: bool | str = False, log: Callable[[str], None] = print,
        on_iteration: Callable[[Job, dict[str, Any]], None] | None = None,
        on_start: Callable[[Job, dict[str, Any]], None] | None = None,
        evaluate_base: bool = False) -> tuple[Job, list[dict[str, Any]]]:
    """Run to config.run.iterations; `on_start(job, status)` once the learner is up (and resumed),
    `on_iteration(job, row)` after each iteration (tests inject faults there). With evaluate_base,
    a fresh run first logs the base model's held-out reward. Returns the job and this call's records
    (metrics.jsonl rows; `job.log.history` holds the whole run's). On an error the job's actors are stopped."""
    job = start(config, run_dir, resume, log)
    try:
        status = _ready(job, config, log, on_start)
        job.gauges = LearnerMetrics(job.run, config.run.iterations)
        job.log = run_log = RunLog(Path(run_dir) if run_dir is not None else None, config,
                                   start=status["iteration"], gauges=job.gauges)
        before = len(run_log.history)
        if evaluate_base and status["iteration"] == 0:
            _evaluate_base(job, config, run_log, log)
        loop = Loop(job, config, run_dir, log, status)
        for iteration in range(status["iteration"], config.run.iterations):
            hold_if_asked(run_dir, iteration, log)
            row = run_log.write(loop.iteration(iteration, run_log.skipped_updates()))
            on_learners(job.learners[:1], "checkpoint")  # after the record: a resumed run never lacks a line
            log(progress_line(row, loop.progress))
            if on_iteration is not None:
                on_iteration(job, row)
        run_log.close()
        return job, run_log.history[before:]
    except BaseException:
        stop(job)
        raise


def _ready(job: Job, config: SolRLConfig, log: Callable[[str], None],
           on_start: Callable[[Job, dict[str, Any]], None] | None) -> dict[str, Any]:
    """Every actor loaded, the learner resumed and its sampling policy published; the learner's status."""
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
    return status


def _evaluate_base(job: Job, config: SolRLConfig, run_log: RunLog, log: Callable[[str], None]) -> None:
    e = config.eval
    log(f"evaluating the base model: {e.prompts} held-out prompts × {e.seeds_per_prompt} seeds, {e.steps} steps")
    evaluation, grid = on_learners(job.learners[:1], "evaluate_base")[0]  # rank 0; its death is LearnerDied
    run_log.write_base(evaluation, grid)
    log("base model   held-out " + "  ".join(f"{k.removeprefix('eval_')} {v:.3f}" for k, v in evaluation.items()))


class Loop:
    """One iteration at a time: explore → train → publish → finish, each a named call; async mode keeps
    the next iteration's slots in flight while this one trains (`prefetched`)."""

    def __init__(self, job: Job, config: SolRLConfig, run_dir: str | None, log: Callable[[str], None],
                 status: dict[str, Any]) -> None:
        self.job, self.config, self.pool = job, config, job.pool
        c = config.cluster
        self.asynchronous, self.lag = c.mode == "async", c.max_policy_lag
        self.streaming = c.stream_regeneration and ALGORITHMS[config.learner.algorithm].remote_explore
        self.prompts = load_prompts(config.prompts.source)
        self.target = ControlTarget(run_dir, c.explorers.count, c.explorers.limit, log)
        self.log = log
        self.version = status["version"]
        # The spread schedule's reference for the next iteration submitted: the (resumed) learner's at the
        # start, then the median over each explored iteration's groups (what the learner checkpoints).
        self.spread = config.explore.schedule == "spread"
        self.spread_reference: float | None = status.get("spread_reference")
        self.prefetched: Batch | None = None
        self.progress = Progress("iteration", config.run.iterations, done=status["iteration"])

    def slots(self, iteration: int) -> list[tuple[int, str]]:  # a pure function: no need to ask the busy learner
        return list(enumerate(iteration_prompts(self.prompts, self.config.run.seed, iteration,
                                                self.config.prompts.per_iteration)))

    def stale(self, group: RankedGroup) -> bool:
        """Explored with a policy more than `max_policy_lag` versions old (only async mode has any)."""
        return self.version - group.policy_version > self.lag

    def submit(self, iteration: int) -> Batch:
        """An iteration's slots to the pool, after the control file's explorer count is applied (nothing
        is in flight at this point). Nodes that joined since get a weight-sync service first, so the pool
        can grow back onto them."""
        _serve_every_node(self.job, self.log)
        self.pool.resize(self.target.read(), lambda: _missing_room(self.config))
        return self.pool.submit(iteration, self.slots(iteration), self.version, self.spread_reference)

    def iteration(self, iteration: int, skipped_so_far: int) -> IterationRecord:
        tick = time.perf_counter()
        ray.get(self.job.learner.ensure_published.remote())  # a restarted sync service gets the newest again
        groups, explored, explorers_work = self.explore(iteration)
        if self.spread:  # before iteration + 1 is submitted (in async mode: now)
            self.spread_reference = spread_reference(g.first_spread for g in groups)
        if self.asynchronous and iteration + 1 < self.config.run.iterations:  # explorers run ahead meanwhile
            self.prefetched = self.submit(iteration + 1)
        explored.update(self.pool.report())
        results = on_learners(self.job.learners, "train", iteration, groups)
        published = on_learners(self.job.learners, "publish")[0]  # the new θ_old to every node
        finished = on_learners(self.job.learners, "finish_iteration")[0]
        result = results[0]
        self.version = result.version
        return IterationRecord(result, sum((r.work for r in results), explorers_work), published, finished,
                               skipped_so_far + result.skipped, explored, time.perf_counter() - tick)

    def explore(self, iteration: int) -> tuple[list[RankedGroup], dict[str, Any], Work]:
        """Every slot's ranked group, each streamed to its learner rank as it arrives; stale groups are
        explored again with the current version. The explorers' numbers of the iteration, and their counted
        work (`explorer_work`)."""
        tick, stats, streamed = time.perf_counter(), {}, {}  # streamed: regenerate ref → its rank

        def stream(group: RankedGroup) -> None:
            if self.streaming and not self.stale(group):
                rank = owner_of(group.slot, self.config.prompts.per_iteration, len(self.job.learners))
                streamed[self.job.learners[rank].regenerate.remote(iteration, group)] = rank

        batch, self.prefetched = self.prefetched or self.submit(iteration), None
        groups = self.pool.collect(batch, stats, on_group=stream)
        arrived = list(groups)  # every group explored, the stale ones dropped below included
        stale = [g.slot for g in groups if self.stale(g)]
        if stale:
            stats["dropped_groups"] = len(stale)
            slots = self.slots(iteration)
            again = self.pool.submit(iteration, [slots[s] for s in stale], self.version, self.spread_reference)
            fresh = {g.slot: g for g in self.pool.collect(again, stats, on_group=stream)}
            arrived += fresh.values()
            groups = [fresh.get(g.slot, g) for g in groups]
        waited = time.perf_counter() - tick
        stats.update(explored_totals(arrived))
        stats.update({"explore_s": max((g.seconds for g in groups), default=0.0), "explore_wall_s": waited,
                      "policy_lag": max((self.version - g.policy_version for g in groups), default=0),
                      "candidates_per_second": sum(len(g.seeds) for g in groups) / max(waited, 1e-9)})
        steps = sum(g.sample_steps for g in groups)
        if steps:  # the explorers' engines: seconds per denoising step of one candidate
            stats["explore_step_s"] = sum(g.sample_s for g in groups) / steps
        wait_learners(self.job.learners, streamed, "regenerate")  # a streamed regeneration's error surfaces here
        return groups, stats, explorer_work(arrived)


def explored_totals(groups: list[RankedGroup]) -> dict[str, Any]:
    """What the explorers did for `groups`, as the driver counts it into the job's totals (the dashboard's
    `solrl_job_*` counters): an explorer's own counters leave with its process when it dies, these do not.
    A group counts once it has reached the driver; work lost with a dead explorer never arrives (its slot's
    retry is what counts), and the snapshots an explorer loads arrive with its next group."""
    return {"explored_candidates": sum(len(g.seeds) for g in groups),
            "explore_busy_s": sum(g.seconds for g in groups),  # all explorers' sampling seconds
            "explorer_syncs": sum(g.syncs for g in groups), "explorer_sync_s": sum(g.sync_s for g in groups)}


def explorer_work(groups: list[RankedGroup]) -> Work:
    """The explorers' counted work for `groups` (every group explored, stale ones dropped and explored again
    included): their low-precision sample-steps and the images they decoded and scored, counted here as a
    learner counts a pool it ranks itself (`learner.slot_rollout.SlotRollout.rollout`)."""
    return Work(lp_sample_steps=sum(g.sample_steps for g in groups), scored_images=sum(g.scored for g in groups))


def stop(job: Job) -> None:
    """End the job's actors, its weight-sync services (their snapshots with them) and its placement; its gauges
    are no longer kept (a process that runs jobs one after another exports only the running one's)."""
    if job.gauges is not None:
        job.gauges.close()
    explorers = job.pool.all_actors() if job.pool is not None else []
    for actor in [*job.learners, *explorers, *(job.scorers or [])]:
        if actor is not None:
            ray.kill(actor, no_restart=True)
    if job.services:  # after their readers and writer: each unlinks its shared-memory region now
        stop_services(job.services)
    if job.placement is not None:
        remove_placement_group(job.placement)
