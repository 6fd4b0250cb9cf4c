"""A node that leaves for good, on one Ray cluster of three nodes on this machine (`ray.cluster_utils.Cluster`: a
raylet and an object store each) that the tests share, each running its own job. With room elsewhere, a spread
job (each actor on its own node, one weight-sync service per node) has its explorer restarted there, and the
node's service is dropped. With none (each node with room for exactly one actor), the explorer stays "restarting":
after `cluster.explorers.lost_after_s` the pool removes it (logged, counted, the `explorers` row drops) and the run
goes on with the other; a node added back gets a weight-sync service, Ray places the freed bundle there, and the
pool grows back with a new explorer on it. The weights are the single process's. One job cannot hold two cases:
the 1 s deadline would remove an explorer merely restarting on a node that joined, and the spread job needs
room that the others must not have."""

from __future__ import annotations

import sys
import time

import pytest
import ray
from hosts import NO_RAY_METRICS
from jobs import assert_same, final_weights, single_process
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group_table
from tiny import tiny_config

from cluster.runtime import driver

# One cluster for all (a start is ~10 s of CPU in a GCS and three raylets with their agents): one pytest-xdist
# worker runs them (loadgroup; pytest is pinned where xdist honours the mark, tests/test_environment.py).
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("three_nodes")]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # node_of runs inside the actors

LOST_AFTER_S = 1.0
# Notice a node's death within ~1 s (the default, ~16 s, would only slow the tests down).
FAST_HEALTH_CHECK = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                     "health_check_timeout_ms": 500, "health_check_failure_threshold": 2}


def node_of(_actor) -> str:
    return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def cluster():
    """A head and two workers, one CPU each, this process its driver; a dead node noticed within ~1 s, and Ray's
    own metrics off (`hosts.NO_RAY_METRICS`: what a removed node costs the agent otherwise)."""
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as patch:  # for every node process started in the module (tests add nodes)
        for name, value in NO_RAY_METRICS.items():
            patch.setenv(name, value)
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECK})
        try:
            for _ in range(2):
                cluster.add_node(num_cpus=1)
            ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()


@pytest.fixture
def three_nodes(cluster):
    """The cluster and its workers, three nodes of one CPU again: each test removes a worker (the lost-node ones
    add one back)."""
    for _ in range(2 - len(cluster.worker_nodes)):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    return cluster, list(cluster.worker_nodes)


def wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(0.2)


def when_up(call, timeout_s: float = 120.0):
    """`ray.get(call())` once the actor it calls is up: an actor Ray is still restarting answers nothing yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(call())
        except ray.exceptions.ActorUnavailableError:
            assert time.monotonic() < deadline, f"the actor was still restarting after {timeout_s:g} s"
            time.sleep(0.5)


def test_an_explorer_lost_with_its_node_is_removed_and_the_pool_grows_back_when_room_returns(three_nodes, tmp_path):
    cluster, workers = three_nodes
    cfg = tiny_config("run.iterations=5", "cluster.explorers.count=2", "cluster.explorers.num_cpus=1",
                      "cluster.learner.num_cpus=1", f"cluster.explorers.lost_after_s={LOST_AFTER_S}", ray=True)
    logged: list[str] = []
    seen: dict = {}

    def steer(job, row) -> None:
        i = row["iteration"]
        if i == 0:  # an explorer's node leaves; the other two nodes are full
            nodes = ray.get([e.__ray_call__.remote(node_of) for e in job.explorers])
            worker_of = {w.node_id: w for w in workers}
            victim = next(k for k, node in enumerate(nodes) if node in worker_of)
            seen["victim"] = job.explorer_names[job.explorers[victim]]
            cluster.remove_node(worker_of[nodes[victim]])
        elif i == 1:  # its slot failed (~2 s) and went to the other explorer; let the deadline pass
            time.sleep(LOST_AFTER_S)
        elif i == 2:  # removed at iteration 2: now a node with room joins, and Ray places the freed bundle there
            seen["bundle"] = bundle = job.pool.free_bundles[0]
            seen["new_node"] = cluster.add_node(num_cpus=1).node_id
            wait_for(lambda: placement_group_table(job.placement)["bundles_to_node_id"][bundle] == seen["new_node"],
                     "the freed bundle to be placed on the new node")
        elif i == 3:  # the new explorer is started at iteration 3: it joins once loaded
            ray.get(list(job.pool.joining))

    job, history = driver.run(cfg, str(tmp_path / "run"), log=logged.append, on_iteration=steer)
    try:
        weights = final_weights(job, tmp_path / "run" / "final")
        grown = job.explorers[-1]
        placed = ray.get(grown.__ray_call__.remote(node_of))
        name = job.explorer_names[grown]
    finally:
        driver.stop(job)
    assert [(m["explorers"], m["explorers_joining"]) for m in history] == [(2, 0), (2, 0), (1, 0), (1, 1), (2, 0)]
    assert [m.get("explorers_lost", 0) for m in history] == [0, 0, 1, 0, 0]
    assert history[1]["explorer_retries"] >= 1 and "explorer_retries" not in history[2]  # no slot sent to it
    lost = [line for line in logged if line.startswith(f"{seen['victim']} unreachable for ")]
    assert len(lost) == 1, logged
    assert "(cluster.explorers.lost_after_s 1; still restarting: its node left with no room elsewhere, or it " \
           "cannot start): removed, 1 explorer(s) take its slots; a new one is started when the cluster has room " \
           "for it again (back to 2)" in lost[0]
    assert f"node {seen['new_node'][:8]} joined the cluster: its weight-sync service is up, explorers can run " \
           "there" in logged
    assert "explorers 1 → 2" in logged
    assert placed == seen["new_node"] and name == "solrl-explorer-2"  # a new explorer, in the freed bundle
    assert [m["explored_candidates"] for m in history] == [16] * 5  # every slot explored, once
    assert_same(weights, single_process(cfg))
    left = [n for n in ray.util.list_named_actors(all_namespaces=True) if "solrl" in str(n)]
    assert not left, f"named actors left behind: {left}"


def test_an_explorer_restarted_on_a_node_that_joined_later_finds_that_nodes_service(three_nodes, tmp_path):
    """Before the deadline, room returns on a new node: Ray restarts the same explorer there, and its node's
    weight-sync service, which did not exist when the job started, is found by name once the driver has
    started it. The pool never shrinks, and the weights are the single process's."""
    cluster, workers = three_nodes
    cfg = tiny_config("run.iterations=4", "cluster.explorers.count=2", "cluster.explorers.num_cpus=1",
                      "cluster.learner.num_cpus=1", "cluster.explorers.lost_after_s=600", ray=True)
    logged: list[str] = []
    seen: dict = {}

    def steer(job, row) -> None:
        if row["iteration"] == 0:
            nodes = ray.get([e.__ray_call__.remote(node_of) for e in job.explorers])
            worker_of = {w.node_id: w for w in workers}
            seen["victim"] = victim = next(k for k, node in enumerate(nodes) if node in worker_of)
            cluster.remove_node(worker_of[nodes[victim]])
            seen["new_node"] = cluster.add_node(num_cpus=1).node_id

    job, history = driver.run(cfg, str(tmp_path / "run"), log=logged.append, on_iteration=steer)
    try:
        weights = final_weights(job, tmp_path / "run" / "final")
        restarted = job.explorers[seen["victim"]]
        # on a loaded machine the run can end before Ray has restarted it (its slots went to the other explorer)
        placed = when_up(lambda: restarted.__ray_call__.remote(node_of))
        services = set(job.services)
    finally:
        driver.stop(job)
    assert placed == seen["new_node"] and seen["new_node"] in services
    assert f"node {seen['new_node'][:8]} joined the cluster: its weight-sync service is up, explorers can run " \
           "there" in logged
    assert [m["explorers"] for m in history] == [2] * 4 and not any(m.get("explorers_lost") for m in history)
    assert [m["explored_candidates"] for m in history] == [16] * 4
    assert_same(weights, single_process(cfg))


def test_spread_over_three_nodes_and_a_node_removed_mid_run_change_nothing(three_nodes, tmp_path, reference_weights):
    """Each actor (half a CPU) on its own node; with room elsewhere, the removed node's explorer restarts there."""
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
        moved_to = when_up(lambda: job.explorers[victim].__ray_call__.remote(node_of))
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
