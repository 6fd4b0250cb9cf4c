"""Fixtures of the tests that run jobs on a real local Ray cluster."""

from __future__ import annotations

import pytest
import ray
from jobs import single_process
from tiny import tiny_config


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


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
