"""The job on three hosts with their own addresses (`hosts.Hosts`: network namespaces joined through a bridge,
a Ray node in each, token auth, `ray job submit` from the head), as a user's cluster is:

    h0 (head: the driver)   learner rank on a GPU   explorer
    h1                      learner rank on a GPU   explorer
    h2                                              explorer (no GPU)

Each host's name resolves to 127.0.0.1, the trap a learner group falls into unless each rank binds its
collectives to the interface carrying its node's IP (`learner.collective_network`). The job holds before
iteration 1 (`cluster.control --hold-before`); the test reads from Ray's state API where each role runs, then
removes h2 for good: as docs/scaling.md promises, its explorer stays "restarting" (no host has room for it)
while its slots go to the others, its sync service is dropped, and the final weights are those of the same
job on one machine, bit for bit. A second job with
the collectives bound to loopback on purpose ends in one line naming the rank, its host, both sides' addresses
and the fix. Needs root; skips otherwise."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from hosts import Hosts, skip_reason
from jobs import assert_same, learner_group_config
from safetensors.torch import load_file
from tiny import tiny_config, tiny_sets

from cluster.runtime.control_file import write_control

# One worker runs both (pytest-xdist's loadgroup): they share the three hosts, which take a minute to start, and
# the learner-group test's run (tests/cluster/test_learner_group.py, in the same group).
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("three_hosts")]

REPO = Path(__file__).resolve().parents[2]
LEARNER_HOSTS = (0, 1)  # the hosts with a (logical) GPU: learner ranks ask for one each
# Each host has 2 CPUs; a learner takes 0.5 and an explorer 1.5, so every host holds exactly one explorer (SPREAD
# alone is best effort: in one run it put two explorers on h2 and none on h1), and none has room for another.
JOB = ["cluster.learner.count=2", "cluster.learner.num_gpus=1", "cluster.explorers.count=3",
       "cluster.explorers.num_cpus=1.5", "cluster.placement_strategy=SPREAD",
       "cluster.learner.collective_timeout_s=60", "run.iterations=3"]


@pytest.fixture(scope="module")
def three_hosts():
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with Hosts(3, gpus=[1 if h in LEARNER_HOSTS else 0 for h in range(3)]) as hosts:
        hosts.start_ray()
        yield hosts


def submit(hosts: Hosts, run_dir: Path, *sets: str) -> subprocess.Popen:
    """`ray job submit` from the head host, as the README says; its output (the job's log) in run_dir.log. The
    submission id is the run directory's test name (`stop` ends the job if the test fails)."""
    argv = ["ray", "job", "submit", "--address", hosts.dashboard, "--submission-id", job_id(run_dir),
            "--working-dir", str(REPO), "--runtime-env",
            str(REPO / "cluster" / "runtime_env.yaml"), "--", "python", "-m", "cluster.launch", "--config",
            "configs/embedded.yaml", "--run-dir", str(run_dir),
            *[arg for item in tiny_sets(*sets, ray=True) for arg in ("--set", item)]]
    log = open(f"{run_dir}.log", "w")  # noqa: SIM115 (closed by finish)
    return subprocess.Popen(hosts.command(0, argv), env=hosts.env(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                            text=True)


def job_id(run_dir: Path) -> str:
    return f"solrl-{run_dir.parent.name}"


def stop(hosts: Hosts, job: subprocess.Popen, run_dir: Path) -> None:
    """End the job on the cluster, not only the client that submitted it (a held job would hold its
    resources, and the next test's job would wait for them)."""
    if job.poll() is None:
        hosts.run(0, ["ray", "job", "stop", "--address", hosts.dashboard, job_id(run_dir)], timeout=120)
        job.kill()
        job.wait(timeout=60)


def finish(job: subprocess.Popen, run_dir: Path, timeout_s: float = 600) -> str:
    job.wait(timeout=timeout_s)
    job.stdout and job.stdout.close()
    return Path(f"{run_dir}.log").read_text()


def wait_for(predicate, what: str, job: subprocess.Popen, run_dir: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert job.poll() is None, f"the job ended before {what}:\n{Path(f'{run_dir}.log').read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.2)


def roles_by_host(hosts: Hosts) -> dict[str, set[int]]:
    """From Ray's state API (on the head): each live job actor's role → the hosts it runs on."""
    def listed(kind: str) -> list[dict]:
        done = hosts.run(0, ["ray", "list", kind, "--address", hosts.dashboard, "--format", "json", "--detail",
                             "--limit", "1000"], timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    ips = {node["node_id"]: node["node_ip"] for node in listed("nodes")}
    roles: dict[str, set[int]] = {}
    for actor in listed("actors"):
        name = actor.get("name") or ""
        if actor["state"] == "ALIVE" and name.startswith("solrl-"):
            role = name.removeprefix("solrl-").rsplit("-", 1)[0]
            roles.setdefault(role, set()).add(hosts.host_of(ips[actor["node_id"]]))
    return roles


def test_a_job_over_three_hosts_trains_as_on_one_machine_and_outlives_a_host_removed_for_good(
        three_hosts, tmp_path, local_ray, learner_group_run):
    hosts = three_hosts
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_control(run_dir, hold_before=1)  # iteration 0 on three hosts, then a hold: the moment to remove one
    job = submit(hosts, run_dir, *JOB)
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").is_file() and "held before iteration 1" in
                 Path(f"{run_dir}.log").read_text(), "hold before iteration 1", job, run_dir)
        roles = roles_by_host(hosts)
        assert roles["learner"] == set(LEARNER_HOSTS)
        assert roles["explorer"] == {0, 1, 2}
        assert roles["weight-sync"] == {0, 1, 2}  # one service per node
        hosts.remove(2)  # for good: its raylet and every actor on it SIGKILLed
        write_control(run_dir, hold_before=None)
        output = finish(job, run_dir)
    finally:
        stop(hosts, job, run_dir)
    assert job.returncode == 0, output[-4000:]
    assert "succeeded" in output.lower(), output[-4000:]
    bound = [line for line in output.splitlines() if ": collectives on " in line]
    assert sorted(line.split("solrl-learner-", 1)[1][:1] for line in bound) == ["0", "1"], output[-4000:]
    for line in bound:
        ip = line.split(" on ", 1)[1].split(":", 1)[0]
        assert f"collectives on {hosts.interface(hosts.host_of(ip))} ({ip}), chosen by carrying the node IP {ip}" \
            in line, line
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in history] == [0, 1, 2]
    assert sum(m.get("explorer_retries", 0) for m in history) >= 1  # h2's slots went elsewhere

    # The same job on one machine: the learner-group test's run (tests/cluster/jobs.py), which differs from this
    # job only in where its actors run and how long collectives wait (its rank 1 killed and resumed: bitwise).
    submitted = tiny_config(*JOB, ray=True).model_dump()
    one_machine = learner_group_config().model_dump()
    assert {k: v for k, v in submitted.items() if k != "cluster"} == \
        {k: v for k, v in one_machine.items() if k != "cluster"}
    assert submitted["cluster"]["learner"]["count"] == one_machine["cluster"]["learner"]["count"]
    assert_same(load_file(run_dir / "final" / "transformer" / "diffusion_pytorch_model.safetensors"),
                learner_group_run()["weights"])


def test_collectives_bound_where_the_peers_cannot_reach_end_the_job_in_one_line(three_hosts, tmp_path):
    hosts = three_hosts
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # one explorer: h2 may be gone already (the test above removes it), and the preflight counts the room
    job = submit(hosts, run_dir, *JOB, "cluster.explorers.count=1", "cluster.learner.network.interface=lo",
                 "cluster.learner.collective_timeout_s=20")
    try:
        output = finish(job, run_dir)
    finally:
        stop(hosts, job, run_dir)
    assert job.returncode != 0
    # one line, printed by the job and repeated by `ray job submit` with the job's last logs
    errors = {line for line in output.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1, output[-4000:]
    error = errors.pop()
    assert "Traceback" not in output, output[-4000:]
    assert " could not connect the learner group's gloo mesh within 20 s: it listens on lo (127.0.0.1), chosen by " \
           "cluster.learner.network.interface; rank " in error, error
    assert "it dialed 127.0.0.1:" in error and "To fix: set cluster.learner.network.interface (or .subnet)" in error
    assert "--resume" in error
