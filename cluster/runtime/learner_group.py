"""The driver's calls to the learner group: every rank at once, and a rank that dies named at once.

A rank blocked in a collective would wait for a dead peer until `cluster.learner.collective_timeout_s`;
the driver waits on each rank's own call instead, so the first death ends the job with `LearnerDied`
(the caller then stops every actor, blocked ranks included, and the run resumes from its checkpoint).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import RayActorError


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
