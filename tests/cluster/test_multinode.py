"""The job on a Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`: a raylet and an object
store each): the learner and the explorers spread over the nodes, one weight-sync service per node, and a node
removed mid-run taking its explorer and its service with it. The weights are the single process's."""

from __future__ import annotations

import contextlib
import sys
import time

import pytest
import ray
from jobs import assert_same, final_weights
from ray.cluster_utils import Cluster
from tiny import tiny_config

from cluster.runtime import driver

pytestmark = pytest.mark.ray
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # node_of runs inside the actors

# Notice a node's death within ~1 s (the default, ~16 s, would only slow the test down).
FAST_HEALTH_CHECK = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                     "health_check_timeout_ms": 500, "health_check_failure_threshold": 2}


def node_of(_actor) -> str:
    return ray.get_runtime_context().get_node_id()


def node_once_up(actor, timeout_s: float = 120.0) -> str:
    """The node of an actor that may still be restarting (each call then fails after ~2 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.__ray_call__.remote(node_of))
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise


@contextlib.contextmanager
def one_cpu_nodes(count: int):
    """A Ray cluster of `count` nodes with one CPU each (a head and count - 1 workers), this process its
    driver; a dead node noticed within ~1 s."""
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECK})
    workers = [cluster.add_node(num_cpus=1) for _ in range(count - 1)]
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def three_nodes():
    with one_cpu_nodes(3) as nodes:
        yield nodes


def test_spread_over_three_nodes_and_a_node_removed_mid_run_change_nothing(three_nodes, tmp_path, reference_weights):
    cluster, workers = three_nodes
    cfg = tiny_config("cluster.explorers.count=2", "cluster.placement_strategy=SPREAD", ray=True)
    seen: dict = {}

    def spread(job, _status) -> None:
        seen["learner"] = ray.get(job.learner.__ray_call__.remote(node_of))
        seen["explorers"] = ray.get([e.__ray_call__.remote(node_of) for e in job.explorers])

    def remove_an_explorers_node(job, metrics) -> None:
        if metrics["iteration"] != 0:
            return
        # the first snapshots reached every node's service: the learner's through shared memory, the
        # others' through the object store
        seen["versions"] = ray.get([s.version.remote() for s in job.services.values()])
        worker_of = {w.node_id: w for w in workers}
        victim = next(i for i, node in enumerate(seen["explorers"]) if node in worker_of)
        seen["victim"] = victim, seen["explorers"][victim]
        cluster.remove_node(worker_of[seen["explorers"][victim]])

    job, history = driver.run(cfg, str(tmp_path / "run"), log=lambda _: None, on_start=spread,
                              on_iteration=remove_an_explorers_node)
    try:
        weights = final_weights(job, tmp_path / "run" / "final")
        victim, gone = seen["victim"]
        moved_to = node_once_up(job.explorers[victim])
        lost = ray.get(job.learner.__ray_call__.remote(lambda learner: learner.publisher.lost_nodes))
    finally:
        driver.stop(job)
    assert len({seen["learner"], *seen["explorers"]}) == 3  # SPREAD: each actor on its own node
    assert len(job.services) == 3 and seen["versions"] == [1, 1, 1]
    assert moved_to != gone and lost == [gone]  # the explorer restarted elsewhere; the node's service is dropped
    assert [m["iteration"] for m in history] == [0, 1]
    assert_same(weights, reference_weights)
    left = [n for n in ray.util.list_named_actors(all_namespaces=True) if "solrl" in str(n)]
    assert not left, f"named actors left behind: {left}"
