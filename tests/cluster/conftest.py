"""Fixtures of the tests that run jobs on a real local Ray cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import ray
from jobs import killed_and_resumed_learner_group, single_process
from tiny import tiny_config


@pytest.fixture
def no_leftover_actors(local_ray):
    """A test must leave no named actor (a weight-sync service) behind for the next one to find."""
    yield
    left = [n for n in ray.util.list_named_actors(all_namespaces=True) if "solrl" in str(n)]
    for name in left:  # clean up, then fail: the next test must start clean either way
        entry = name if isinstance(name, dict) else {"name": name, "namespace": None}
        ray.kill(ray.get_actor(entry["name"], namespace=entry.get("namespace")), no_restart=True)
    assert not left, f"named actors left behind: {left}"


@pytest.fixture(scope="session")
def reference_weights():
    """The single-process trainer's weights at the Ray tests' tiny scale: what every job must reproduce."""
    return single_process(tiny_config(ray=True))


@pytest.fixture(scope="session")
def learner_group_run(tmp_path_factory) -> Callable[[], dict[str, Any]]:
    """`learner_group_run()` (with a local Ray up): `jobs.killed_and_resumed_learner_group`, run once per process.
    The learner-group test checks it; the three-host test compares its own job's weights with it (both run in
    one pytest-xdist group, so the job runs once)."""
    cache: dict[str, dict[str, Any]] = {}

    def run() -> dict[str, Any]:
        if "run" not in cache:
            cache["run"] = killed_and_resumed_learner_group(tmp_path_factory.mktemp("learner_group") / "run")
        return cache["run"]

    return run
