"""The driver's calls to the learner group: every rank at once, and a rank that dies named at once.

A rank blocked in a collective would wait for a dead peer until `cluster.learner.collective_timeout_s`;
the driver waits on each rank's own call instead, so the first death ends the job with `LearnerDied`
(the caller then stops every actor, blocked ranks included, and the run resumes from its checkpoint).
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from cluster.config.schema import LearnerGroupConfig
from learner.data_parallel import LearnerGroupUnreachable

REPORT_GRACE_S = 10.0  # after rank 0 fails to form the group: time for a dialing rank to say what it dialed


class JobFailed(RuntimeError):
    """The job cannot go on; the run resumes from its last checkpoint."""


class LearnerDied(JobFailed):
    """A learner rank died: the others would wait for it in their next collective."""


def on_learners(learners: list[Any], method: str, *args: Any) -> list[Any]:
    """Call `method` on every learner rank; their results in rank order."""
    refs = {getattr(actor, method).remote(*args): rank for rank, actor in enumerate(learners)}
    results = wait_learners(learners, refs, method)
    return [results[ref] for ref in refs]


def wait_learners(learners: list[Any], refs: dict[Any, int], method: str) -> dict[Any, Any]:
    """Results of learner calls (ref → the rank it went to), as they finish; a dead rank raises `LearnerDied`."""
    results, pending = {}, list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            results[ready[0]] = ray.get(ready[0])
        except RayActorError as exc:
            raise LearnerDied(f"learner rank {refs[ready[0]]} of {len(learners)} died in {method}: "
                              f"{str(exc).splitlines()[0]}") from exc
    return results


def join_group(learners: list[Any], address: str, config: LearnerGroupConfig) -> list[str]:
    """Every rank joins the group at `address` (rank 0's rendezvous); where each one's collectives bind,
    in words. A rank that cannot reach the others ends the job with one line (`JobFailed`) as soon as it
    says so, each rank bounded by `collective_timeout_s`: a rank other than 0 is named first (it dialed
    and knows what it dialed; rank 0 only waits, and gloo's listening side may wait several times the
    timeout). Rank 0's own failure is reported after the others had `REPORT_GRACE_S` to report theirs."""
    pending = {actor.join.remote(address, config.collective_timeout_s, config.network.model_dump()): rank
               for rank, actor in enumerate(learners)}
    bound: dict[int, str] = {}
    failed: dict[int, str] = {}
    grace_until: float | None = None
    while pending:
        timeout = None if grace_until is None else max(0.0, grace_until - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
        if not ready:
            break  # only rank 0 failed, and the others said nothing more within the grace
        rank = pending.pop(ready[0])
        try:
            bound[rank] = ray.get(ready[0])
        except LearnerGroupUnreachable as exc:
            failed[rank] = str(getattr(exc, "cause", exc)).strip()
            if rank != 0:
                break
            grace_until = time.monotonic() + REPORT_GRACE_S
        except RayActorError as exc:
            raise LearnerDied(f"learner rank {rank} of {len(learners)} died joining the group: "
                              f"{str(exc).splitlines()[0]}") from exc
    if failed:
        named = min(failed, key=lambda r: (r == 0, r))
        others = sorted(set(failed) - {named})
        also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)" if others else ""
        raise JobFailed(failed[named].rstrip(".") + also)
    return [bound[rank] for rank in sorted(bound)]
