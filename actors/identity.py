"""How the job's actors are called: their names in the Ray dashboard, their namespace, their metric labels.

Every actor of a job lives in the job's own namespace, `solrl-<run>-<tag>` (`<run>`: the run directory's
name, `<tag>`: 8 random hex digits), so two jobs (or two test runs in one Ray session) never collide on a
name. The namespace is also the `run` label of every metric the job exports: unique per job even when two
run directories share a name (`/a/exp` and `/b/exp`), and still read as the run on a dashboard; each launch
of a run (a resume too) is a new job with a new label, and `launches.jsonl` records which. Each actor is
named after its role and index: `solrl-learner-<rank>`,
`solrl-explorer-<i>` (indices are never reused within a job: an explorer added by `cluster.control` after one
was removed gets a new index, because Ray frees a killed actor's name only asynchronously), and
`solrl-scorer-<i>`; each node's weight-sync service is `solrl-weight-sync-<node>` (`weight_sync.service`).
The same string is the actor's `repr`, which Ray prints before each of its log lines and shows in the
dashboard's Actors table. Find them with `ray list actors --filter "name=solrl-explorer-0"` or in the
dashboard's Actors page.
"""

from __future__ import annotations

import re
from pathlib import Path

ROLES = ("learner", "explorer", "scorer")


def actor_name(role: str, index: int) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown actor role {role!r}; one of {ROLES}")
    return f"solrl-{role}-{index}"


def run_label(run_dir: str | None, run_name: str) -> str:
    """The run's short name: its run directory's name, else `run.name`. The job's name and namespace start
    with it; it is not unique (two run directories may share a name), so the metrics' `run` label is the
    namespace (`job_namespace`), not this."""
    return Path(run_dir).name if run_dir else run_name


def job_name(run: str) -> str:
    """The Ray job's name (the dashboard's Name column; `job_name` in the job's metadata); a submission id
    starts with it: `<job name>-<anything unique>`."""
    return f"solrl-{run}"


def job_namespace(run: str, tag: str) -> str:
    """The job's namespace, and the `run` label of its metrics: `solrl-<run>-<tag>`, with only the characters
    Ray accepts."""
    return f"{job_name(re.sub(r'[^A-Za-z0-9_.-]', '_', run))}-{tag}"
