"""The job's explorers, one owner: who explores which slot, lost slots sent again, crash loops, resizing.

    submit(iteration, slots, version)   one explore task per (slot, prompt), round robin (with the spread
                                        schedule's reference of the iteration, when it has one)
    collect(batch, stats, on_group)     every slot's ranked group; `on_group` as each arrives
    resize(target)                      toward `target` explorers, only while no slot is in flight
    report()                            the pool's size, and what it counted since the last report

Faults: a slot lost with an explorer is sent again after a backoff (0.5 s doubling to 8 s) to the next
explorer in turn — with one explorer, the same one once it has restarted — until `retry.timeout_s`
(`cluster.explorers.restart_timeout_s`). Derived seeds and the pinned version make a retry give the
same group. An explorer that dies `retry.max_crashes` times in a row without finishing a slot is in a
crash loop: `ExplorerCrashLoop` names it (the run resumes from its last checkpoint). One crash fails
every slot queued on it, and counts once.

Lost explorers: one whose slots have all failed for `lost_after_s` (`cluster.explorers.lost_after_s`:
its node left and Ray has no room to restart it elsewhere, so it stays "restarting" and every slot sent
to it fails after ~2 s) is removed at the next `resize`: stopped, its placement bundle freed, counted
(`explorers_lost`). It is missing from the target, so the pool grows back: a replacement is spawned into
the freed bundle once Ray has placed that bundle again (`bundle_ready`: room returned), never elsewhere
meanwhile. The last explorer is never removed (its slots wait for it up to `retry.timeout_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from cluster.runtime.learner_group import JobFailed

HEALTH_CHECK_S = 5.0  # a collect that sees no result this long calls `on_idle` (make sure snapshots are served)
BACKOFF_S = (0.5, 8.0)  # first wait before re-sending a lost slot, and the cap of its doubling
# Ray's words for a task sent to an actor that is still restarting: a wait, not another death.
RESTARTING = "actor is restarting"


class ExplorerCrashLoop(JobFailed):
    """An explorer keeps dying: retrying would never end."""


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
class Batch:
    """Explore tasks in flight for one iteration, all pinned to the policy `version` (and, under the spread
    schedule, to the iteration's `spread_reference`: a re-sent slot gets the same pool)."""

    iteration: int
    version: int
    pending: dict[Any, Task] = field(default_factory=dict)  # ref → task
    spread_reference: float | None = None


@dataclass
class Joiner:
    actor: Any
    bundle: int | None
    since: float  # when it was asked for


Spawn = Callable[[int | None], Any]  # placement bundle (None: anywhere) → a new explorer actor
LOST_PROBE_S = 30.0  # how long a lost explorer's last check may wait for its answer
WAIT = -1  # `_next_bundle`: a freed bundle waits for room; spawn nothing yet


class ExplorerPool:
    def __init__(self, actors: list[Any], *, bundles: list[int | None] | None = None, spawn: Spawn | None = None,
                 retry: RetryPolicy | None = None, join_timeout_s: float = 600.0, lost_after_s: float | None = None,
                 bundle_ready: Callable[[int], bool] = lambda _bundle: True,
                 name_of: Callable[[Any], str] = lambda _actor: "an explorer",
                 on_idle: Callable[[], None] | None = None, log: Callable[[str], None] = print) -> None:
        """`spawn`: makes an explorer for `resize` (None: a fixed pool); `lost_after_s`: unreachable this long,
        an explorer is removed (None: never); `bundle_ready(b)`: Ray has placed bundle b where an explorer can
        run; `name_of`: an explorer's name, for the log; `on_idle`: called when no result came for
        HEALTH_CHECK_S (the driver re-sends the newest snapshot to restarted sync services)."""
        self.actors = list(actors)
        self.bundles = list(bundles) if bundles is not None else [None] * len(self.actors)
        self.spawn, self.retry, self.on_idle, self.log = spawn, retry or RetryPolicy(), on_idle, log
        self.join_timeout_s, self.lost_after_s = join_timeout_s, lost_after_s
        self.bundle_ready, self.name_of = bundle_ready, name_of
        self.free_bundles: list[int] = []  # bundles left by removed explorers
        self.down_since: dict[Any, float] = {}  # actor → its first failed slot since it last finished one
        self.lost_unreported = 0  # explorers removed as lost since the last `report()`
        self.joining: dict[Any, Joiner] = {}  # ready ref → a loading explorer
        self.unplaced_at: int | None = None  # a target whose joiner found no room: not retried until it changes
        self.deaths: dict[int, int] = {}  # per explorer, in a row, since its last finished slot
        self.mark: dict[int, int] = {}  # tasks dispatched up to here met that death
        self.seq = 0

    def all_actors(self) -> list[Any]:
        return [*self.actors, *(j.actor for j in self.joining.values())]

    def size(self) -> dict[str, int]:
        return {"explorers": len(self.actors), "explorers_joining": len(self.joining)}

    def report(self) -> dict[str, int]:
        """The size, and the explorers removed as lost since the last report (when any): a record's numbers."""
        lost, self.lost_unreported = self.lost_unreported, 0
        return {**self.size(), **({"explorers_lost": lost} if lost else {})}

    # ---- exploring -------------------------------------------------------------------------------
    def _send(self, batch: Batch, task: Task) -> None:
        self.seq += 1
        task.seq = self.seq
        # only a spread schedule's batches past its first iteration carry a reference
        extra = {} if batch.spread_reference is None else {"spread_reference": batch.spread_reference}
        batch.pending[self.actors[task.explorer].explore.remote(batch.iteration, task.slot, task.prompt,
                                                                 batch.version, **extra)] = task

    def submit(self, iteration: int, slots: list[tuple[int, str]], version: int,
               spread_reference: float | None = None) -> Batch:
        batch = Batch(iteration, version, spread_reference=spread_reference)
        for slot, prompt in slots:
            self._send(batch, Task(slot, prompt, slot % len(self.actors), 0))
        return batch

    def collect(self, batch: Batch, stats: dict[str, Any], on_group: Callable[[Any], None] | None = None) -> list:
        """Wait for every slot's ranked group (in slot order); a slot whose explorer died is sent again after
        a backoff. Counts `explorer_retries`, `explorer_deaths` and `explorer_wait_s` into `stats`."""
        groups: dict[int, Any] = {}
        waiting: list[tuple[float, Task]] = []  # (when to re-send, task)
        while batch.pending or waiting:
            now = time.monotonic()
            for due, task in [w for w in waiting if w[0] <= now]:
                waiting.remove((due, task))
                task.explorer = (task.slot + task.tries) % len(self.actors)
                self._send(batch, task)
                stats["explorer_retries"] = stats.get("explorer_retries", 0) + 1
            if not batch.pending:
                time.sleep(max(0.0, min(due for due, _ in waiting) - time.monotonic()))
                continue
            timeout = min([HEALTH_CHECK_S] + [max(0.0, due - now) for due, _ in waiting])
            ready, _ = ray.wait(list(batch.pending), num_returns=1, timeout=timeout)
            if not ready:
                if not waiting and self.on_idle is not None:  # explorers may wait for a lost snapshot
                    self.on_idle()
                continue
            task = batch.pending.pop(ready[0])
            try:
                groups[task.slot] = ray.get(ready[0])
            except RayActorError as exc:
                waiting.append((self._lost(batch, task, exc, stats), task))
                continue
            self.deaths[task.explorer] = 0
            self.down_since.pop(self.actors[task.explorer], None)
            if on_group is not None:
                on_group(groups[task.slot])
        return [groups[s] for s in sorted(groups)]

    def _lost(self, batch: Batch, task: Task, exc: RayActorError, stats: dict[str, Any]) -> float:
        """A task that met a dead explorer: count the death once per crash, end a crash loop or a slot that
        found no explorer for too long; when to send it again."""
        now = time.monotonic()
        self.down_since.setdefault(self.actors[task.explorer], now)
        if RESTARTING not in str(exc) and task.seq > self.mark.get(task.explorer, 0):
            self.deaths[task.explorer] = self.deaths.get(task.explorer, 0) + 1
            self.mark[task.explorer] = self.seq
            stats["explorer_deaths"] = stats.get("explorer_deaths", 0) + 1
            if self.deaths[task.explorer] >= self.retry.max_crashes:
                raise ExplorerCrashLoop(
                    f"explorer {task.explorer} died {self.deaths[task.explorer]} times in a row without finishing "
                    f"a slot (iteration {batch.iteration}, last slot {task.slot}: {task.prompt!r}); its log is in "
                    "the Ray dashboard (Actors → solrl-explorer-<i>) and the job's logs") from exc
        task.first_failure = task.first_failure or now
        if now - task.first_failure > self.retry.timeout_s:
            raise ExplorerCrashLoop(
                f"slot {task.slot} of iteration {batch.iteration} found no live explorer for "
                f"{now - task.first_failure:.0f} s (cluster.explorers.restart_timeout_s); last error: "
                f"{str(exc).splitlines()[0]}") from exc
        task.tries += 1
        delay = min(BACKOFF_S[0] * 2 ** (task.tries - 1), BACKOFF_S[1])
        stats["explorer_wait_s"] = stats.get("explorer_wait_s", 0.0) + delay
        return now + delay

    # ---- resizing --------------------------------------------------------------------------------
    def resize(self, target: int, missing_room: Callable[[], str] = lambda: "") -> dict[str, int]:
        """Move toward `target` explorers; call only while no slot is in flight. New ones load in the
        background and join here once ready; one not placed and loaded within `join_timeout_s` is stopped
        and reported with `missing_room()` (that target is not retried until another is asked for).
        Removed ones (still loading ones first, then the newest) stop now, as do lost ones (unreachable for
        `lost_after_s`), whose replacements wait for their bundles. Seeds are derived, so who explores a
        slot changes nothing."""
        if target != self.unplaced_at:
            self.unplaced_at = None
        self._remove_lost(target)
        before = len(self.actors)
        self._admit_ready()
        self._expire_joiners(target, missing_room)
        wanted = len(self.actors) + len(self.joining) if self.unplaced_at is not None else target
        while len(self.actors) + len(self.joining) < wanted:
            bundle = self._next_bundle()
            if bundle == WAIT:
                break
            actor = self.spawn(bundle)
            self.joining[actor.pid.remote()] = Joiner(actor, bundle, time.monotonic())
        while self.joining and len(self.actors) + len(self.joining) > target:
            self._drop(self.joining.pop(next(reversed(self.joining))))
        while len(self.actors) > max(target, 1):
            self._drop(Joiner(self.actors.pop(), self.bundles.pop(), 0.0))
            self.deaths.pop(len(self.actors), None)  # the index may be reused by a new explorer
            self.mark.pop(len(self.actors), None)
        if len(self.actors) != before:
            self.log(f"explorers {before} → {len(self.actors)}"
                     + (f" ({len(self.joining)} loading)" if self.joining else ""))
        return self.size()

    def _next_bundle(self) -> int | None:
        """Where the next explorer goes: a freed bundle Ray has placed; WAIT while the freed ones wait for room
        (a lost explorer's replacement goes into its bundle, not elsewhere); None (anywhere) when none is free."""
        if not self.free_bundles:
            return None
        for bundle in self.free_bundles:
            if self.bundle_ready(bundle):
                self.free_bundles.remove(bundle)
                return bundle
        return WAIT

    def _remove_lost(self, target: int) -> None:
        """Stop explorers unreachable for `lost_after_s` (checked once more: one that answers stays); the last
        one stays. Nothing is in flight here, so positions may shift."""
        if self.lost_after_s is None:
            return
        now = time.monotonic()
        overdue = [a for a in self.actors if now - self.down_since.get(a, now) > self.lost_after_s]
        if not overdue:
            return
        # A call to a restarting actor fails within ~2 s; one that came back since its last failure answers.
        # Bounded anyway: an actor still being placed may leave the call queued rather than failing it.
        probes = {a.pid.remote(): a for a in overdue}
        for ref, actor in probes.items():
            try:
                ray.get(ref, timeout=LOST_PROBE_S)
            except (RayActorError, GetTimeoutError):
                continue
            self.down_since.pop(actor, None)
            overdue.remove(actor)
        for actor in overdue:
            if len(self.actors) == 1:
                break
            i = self.actors.index(actor)
            down = now - self.down_since.pop(actor)
            self._drop(Joiner(self.actors.pop(i), self.bundles.pop(i), 0.0))
            # per-position bookkeeping follows the explorers after i down by one
            self.deaths = {j - (j > i): n for j, n in self.deaths.items() if j != i}
            self.mark = {j - (j > i): n for j, n in self.mark.items() if j != i}
            self.lost_unreported += 1
            self.unplaced_at = None  # the pool is short of its target again: try it again
            self.log(f"{self.name_of(actor)} unreachable for {down:.0f} s (cluster.explorers.lost_after_s "
                     f"{self.lost_after_s:g}; still restarting: its node left with no room elsewhere, or it cannot "
                     f"start): removed, {len(self.actors)} explorer(s) take its slots; a new one is started when "
                     f"the cluster has room for it again (back to {target})")

    def _drop(self, joiner: Joiner) -> None:
        ray.kill(joiner.actor, no_restart=True)
        self.down_since.pop(joiner.actor, None)
        if joiner.bundle is not None:
            self.free_bundles.append(joiner.bundle)

    def _admit_ready(self) -> None:
        """Loaded joiners become explorers; one that could not start gives its bundle back."""
        ready = ray.wait(list(self.joining), num_returns=len(self.joining), timeout=0)[0] if self.joining else []
        for ref in ready:
            joiner = self.joining.pop(ref)
            try:
                ray.get(ref)
            except RayActorError as exc:
                self.log(f"a new explorer failed to start: {str(exc).splitlines()[0]}")
                if joiner.bundle is not None:
                    self.free_bundles.append(joiner.bundle)
                continue
            self.actors.append(joiner.actor)
            self.bundles.append(joiner.bundle)

    def _expire_joiners(self, target: int, missing_room: Callable[[], str]) -> None:
        """A joiner never placed (no room) or never loaded within join_timeout_s is stopped, not left joining."""
        now = time.monotonic()
        for ref, joiner in list(self.joining.items()):
            if now - joiner.since > self.join_timeout_s:
                self.log(f"a new explorer was not placed and loaded within {self.join_timeout_s:g} s "
                         f"(cluster.explorers.join_timeout_s): {missing_room()}; staying at "
                         f"{len(self.actors) + len(self.joining) - 1} explorer(s) — add nodes, or ask for fewer")
                del self.joining[ref]
                self._drop(joiner)
                self.unplaced_at = target
