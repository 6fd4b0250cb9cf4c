"""The distributed job on a real local Ray cluster: equivalence, faults, resumes.

Every process runs torch with one thread, so the learner actor, the explorers and the single-process
reference compute bit for bit the same thing. Faults are real: processes die by SIGKILL at a chosen
point, placed there by a function of tests/cluster/faults.py run inside the actor; NaNs are injected the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import pytest
import ray
import torch
from faults import (
    delay_explore,
    die_in_update,
    die_on_explore_call,
    die_writing_checkpoint,
    nan_loss_for_one_update,
    nan_reward_once,
)
from jobs import assert_same, final_weights, run_job, single_process
from tiny import tiny_config, tiny_sets

from cluster import control, launch
from cluster.reports import summary as summary_report
from cluster.runtime import control_file, driver, learner_group
from cluster.runtime.explorer_pool import ExplorerCrashLoop, ExplorerPool, RetryPolicy
from weight_sync.codecs import Manifest, decode
from weight_sync.shm import Region

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("no_leftover_actors")]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # CrashingExplorer below runs in a worker



def config(*overrides: str):
    return tiny_config(*overrides, ray=True)


# ---- equivalence ----------------------------------------------------------------------------------------
def explorer_faults(history: list[dict]) -> dict[str, int]:
    """The run's explorer deaths and the slots sent again, over every iteration."""
    return {k: sum(m.get(k, 0) for m in history) for k in ("explorer_deaths", "explorer_retries")}


def arm_explorer_death_on_call_3(job, _status) -> None:
    """The only explorer dies in its third explore task: iteration 1's first slot (2 slots an iteration)."""
    ray.get(job.explorers[0].__ray_call__.remote(die_on_explore_call, 3))


def test_one_unstreamed_explorer_killed_mid_explore_gives_the_single_process_weights(local_ray, tmp_path,
                                                                                     reference_weights):
    """One job for three scenarios that each leave the weights those of the single process: one explorer
    (the default), regeneration not streamed, and that explorer killed in iteration 1's first slot (the slot
    waits for the restart and goes to the same explorer again). A job's cost is starting it."""
    weights, history = run_job(config("cluster.stream_regeneration=false"), tmp_path / "one",
                               on_start=arm_explorer_death_on_call_3)
    assert_same(weights, reference_weights)
    stats = explorer_faults(history)
    assert stats["explorer_deaths"] == 1 and stats["explorer_retries"] >= 1, stats
    assert [m["streamed_slots"] for m in history] == [[], []]
    assert [m["iteration"] for m in history] == [0, 1] and history[-1]["policy_version"] == 2
    assert all("rank_spearman" in m for m in history)
    assert 0 < history[1]["learner_idle_fraction"] < 1  # it waited for the explorer of iteration 1 (and its restart)


def test_two_explorers_streamed_in_arrival_order_give_the_single_process_weights(local_ray, tmp_path,
                                                                                reference_weights):
    """Slot 0's explorer answers late: the learner regenerates slot 1 first, while slot 0 is explored, and
    the weights are bitwise those of the single process (as are the unstreamed run's above). One job for two
    scenarios, two explorers and streaming: a job's cost is starting it."""

    def slow_first_explorer(job, status) -> None:
        ray.get(job.explorers[0].__ray_call__.remote(delay_explore, 3.0))

    streamed, history = run_job(config("cluster.explorers.count=2"), tmp_path / "streamed",
                                on_start=slow_first_explorer)
    assert [m["streamed_slots"] for m in history] == [[1, 0], [1, 0]]
    assert all(m["streamed_rollout_s"] > 0 for m in history)
    assert_same(streamed, reference_weights)


def test_explorers_on_the_real_fp8_engine_train_the_project_fp8_weights(local_ray, tmp_path):
    """The job with its explorers on torchao's FP8 engine trains bitwise the weights of the single process
    exploring with the project's FP8 fake quantization (same E4M3 codes, so the same seeds are kept), and
    each iteration records the step price of both phases."""
    fp8 = ("explore.precision=fp8", "explore.allow_emulation=true")
    weights, history = run_job(config(*fp8, "explore.backend=torchao"), tmp_path / "torchao")
    assert_same(weights, single_process(config(*fp8, "explore.backend=project")))
    for m in history:
        assert m["explore_step_s"] > 0 and m["regen_step_s"] > 0
        assert m["explore_regen_step_ratio"] == m["explore_step_s"] / m["regen_step_s"]


def test_a_multi_reward_served_by_a_scorer_actor_changes_nothing(local_ray, tmp_path):
    """Explorers and the learner send their images to a RewardScorer actor, which holds both reward
    models; the weighted sum is taken by the callers. Same weights as scoring in process."""
    multi = "reward.weights={digit_alignment: 1.0, jpeg_compressibility: 0.5}"
    weights, history = run_job(config(multi, "cluster.scorers.count=1", "cluster.scorers.num_cpus=0.25"),
                               tmp_path / "scorer")
    assert_same(weights, single_process(config(multi)))
    for m in history:  # each component logged beside the weighted total
        assert m["reward_mean"] == pytest.approx(m["reward_digit_alignment"] + 0.5 * m["reward_jpeg_compressibility"],
                                                 rel=1e-5)


def test_async_mode_ranks_with_the_previous_version_through_an_explorer_killed_in_a_prefetch(local_ray, tmp_path):
    """Lag 1: iteration i ≥ 1 is ranked with version i - 1 and regenerated with version i. In the same job
    (a job's cost is starting it) the only explorer dies in its third explore task: iteration 1's first slot,
    in the prefetch that runs while the learner trains on iteration 0. The slot waits for the restart and is
    explored again with the version it was pinned to, which the services still keep (the last two)."""
    cfg = config("cluster.mode=async", "cluster.max_policy_lag=1", "run.iterations=3")
    # calls 1-2 explore iteration 0, 3-4 prefetch iteration 1; a third iteration's prefetch only comes after them
    weights, history = run_job(cfg, tmp_path / "async", on_start=arm_explorer_death_on_call_3)
    assert [m["policy_lag"] for m in history] == [0, 1, 1]  # iteration 0 has nothing to run ahead of
    assert [m["sampled_with_version"] for m in history] == [0, 1, 2]
    stats = explorer_faults(history)
    assert stats["explorer_deaths"] == 1 and stats["explorer_retries"] >= 1, stats
    assert_same(weights, single_process(cfg, lagged=True))


def test_async_mode_with_no_lag_allowed_is_the_synchronous_run(local_ray, tmp_path):
    """Max lag 0: every group explored ahead is stale, dropped (counted) and explored again, which makes the
    run exactly the synchronous one."""
    cfg0 = config("cluster.mode=async", "cluster.max_policy_lag=0", "run.iterations=3")
    weights0, history0 = run_job(cfg0, tmp_path / "async0")
    assert [m.get("dropped_groups", 0) for m in history0] == [0, 2, 2]
    assert_same(weights0, single_process(cfg0))


def test_the_spread_schedule_sends_each_iteration_its_reference_to_the_explorers(local_ray, tmp_path):
    """explore.schedule=spread: iteration 0 explores every slot's N; the driver sends iteration 1's reference
    (the median of iteration 0's first-chunk spreads) with each request, and the two explorers' pools are the
    single process's. The default proportional rule gives (6 + 8)/2 · std ÷ median within [6, 8]: the slot
    below the median keeps its first 6, the one above takes 7."""
    cfg = config("explore.schedule=spread", "explore.spread_first=6", "cluster.explorers.count=2")
    weights, history = run_job(cfg, tmp_path / "spread")
    assert [m["explored_candidates"] for m in history] == [16, 13]
    assert_same(weights, single_process(cfg))


# ---- a crashed explorer ---------------------------------------------------------------------------------
@ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
class CrashingExplorer:
    """Dies in every explore call: a crash loop (a bad node, a poisoned input)."""

    def explore(self, iteration, slot, prompt, version):
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_crash_loop_ends_the_job_naming_the_explorer(local_ray):
    actor = CrashingExplorer.remote()
    pool = ExplorerPool([actor], retry=RetryPolicy(max_crashes=3, timeout_s=120))
    stats: dict = {}
    batch = pool.submit(4, [(0, "a handwritten digit one"), (1, "a handwritten digit two")], 0)
    with pytest.raises(ExplorerCrashLoop, match=r"explorer 0 died 3 times in a row .*iteration 4"):
        pool.collect(batch, stats)
    assert stats["explorer_deaths"] == 3  # the two slots queued on it died together: one death each time
    ray.kill(actor, no_restart=True)


@ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
class StuckExplorer:
    """Dies in its first explore call and never comes back: its restart never ends, so Ray keeps it
    "restarting", as it does an explorer whose node left with no room elsewhere."""

    def __init__(self, started: str) -> None:
        if os.path.exists(started):  # the restart
            time.sleep(3600)
        open(started, "w").close()

    def explore(self, iteration, slot, prompt, version):
        os.kill(os.getpid(), signal.SIGKILL)

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class SteadyExplorer:
    def explore(self, iteration, slot, prompt, version):
        return slot

    def pid(self) -> int:
        return os.getpid()


def test_an_explorer_unreachable_past_the_deadline_is_removed_and_replaced(local_ray, tmp_path):
    """Its slot goes to the other explorer; at the next resize past `lost_after_s` it is stopped, counted and
    logged, and the pool asks for a new one to reach its target again (outside a placement group: anywhere)."""
    stuck, steady = StuckExplorer.remote(str(tmp_path / "started")), SteadyExplorer.remote()
    logged: list[str] = []
    pool = ExplorerPool([stuck, steady], spawn=lambda _bundle: SteadyExplorer.remote(), lost_after_s=0.5,
                        name_of=lambda actor: "solrl-explorer-0" if actor == stuck else "?", log=logged.append)
    stats: dict = {}
    assert pool.collect(pool.submit(0, [(0, "a"), (1, "b")], 0), stats) == [0, 1]
    assert stats["explorer_deaths"] == 1 and stats["explorer_retries"] == 1
    time.sleep(0.5)  # past the deadline, whatever the machine's pace
    assert pool.resize(2) == {"explorers": 1, "explorers_joining": 1}
    assert pool.actors == [steady]
    assert pool.report() == {"explorers": 1, "explorers_joining": 1, "explorers_lost": 1}
    assert pool.report() == {"explorers": 1, "explorers_joining": 1}  # counted once
    assert len(logged) == 1 and logged[0].startswith("solrl-explorer-0 unreachable for "), logged
    assert logged[0].endswith("removed, 1 explorer(s) take its slots; a new one is started when the cluster has "
                              "room for it again (back to 2)")
    ray.get(list(pool.joining))
    assert pool.resize(2) == {"explorers": 2, "explorers_joining": 0}
    assert pool.collect(pool.submit(1, [(0, "a"), (1, "b")], 0), stats) == [0, 1]
    assert stats["explorer_retries"] == 1  # no slot went to the removed one
    for actor in pool.all_actors():
        ray.kill(actor, no_restart=True)


# ---- a crashed learner, resumed -------------------------------------------------------------------------
def logged_iterations(run_dir) -> list[int]:
    return [json.loads(x)["iteration"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_learner_killed_in_train_then_in_its_final_checkpoint_resumes_bitwise(local_ray, tmp_path,
                                                                                reference_weights, capsys):
    """Three starts of one run (two faults, each a run of two starts before: a job's cost is starting it). The
    first dies inside iteration 1's update. The resume dies half way through the final checkpoint (iteration
    2), after logging iteration 1's metrics. The next resume takes iteration 1's complete checkpoint again,
    drops the logged line it will redo, redoes it."""
    cfg, run_dir = config("eval.every=1"), tmp_path / "run"
    args = argparse.Namespace(resume=None, checkpoint="latest", config="configs/embedded.yaml", set=tiny_sets(ray=True))

    def started(_job, status) -> None:
        launch.record_launch(run_dir, cfg, args, status["iteration"])

    def kill_in_second_update(job, metrics) -> None:
        if metrics["iteration"] == 0:
            ray.get(job.learner.__ray_call__.remote(die_in_update))

    def started_to_die_in_the_final_checkpoint(job, status) -> None:
        started(job, status)
        ray.get(job.learner.__ray_call__.remote(die_writing_checkpoint, 1))  # the first from now: iteration 2's

    with pytest.raises(learner_group.LearnerDied, match="learner rank 0 of 1 died in train"):
        driver.run(cfg, str(run_dir), log=lambda _: None, evaluate_base=True, on_iteration=kill_in_second_update,
                   on_start=started)
    assert logged_iterations(run_dir) == [0]

    args.resume = str(run_dir)
    with pytest.raises(learner_group.LearnerDied, match="learner rank 0 of 1 died in checkpoint"):
        driver.run(cfg, str(run_dir), resume=True, log=lambda _: None, evaluate_base=True,
                   on_start=started_to_die_in_the_final_checkpoint)
    assert logged_iterations(run_dir) == [0, 1]
    assert json.loads((run_dir / "checkpoint" / "meta.json").read_text())["iteration"] == 1

    job, history = driver.run(cfg, str(run_dir), resume=True, log=lambda _: None, evaluate_base=True,
                              on_start=started)
    try:
        assert_same(final_weights(job, run_dir / "final"), reference_weights)
        summary = summary_report.finish(cfg, run_dir, job, job.log.history)
    finally:
        driver.stop(job)
    assert [m["iteration"] for m in history] == [1]
    # the whole run is in the bookkeeping: both iterations once, the base evaluation of the first start
    assert logged_iterations(run_dir) == [0, 1]
    assert summary["iterations"] == 2 and "eval_reward" in summary["base_eval"]
    assert summary["base_eval"] == json.loads((run_dir / "base_eval.json").read_text())
    assert summary["run_dir"] == str(run_dir) and os.path.isabs(summary["final"]["transformer"])
    launches = [json.loads(x) for x in (run_dir / "launches.jsonl").read_text().splitlines()]
    assert [(x["resume"], x["from_iteration"]) for x in launches] == [(False, 0), (True, 1), (True, 1)]

    # --resume of the finished run changes nothing and says so; a failed resume rewrites nothing
    files = {name: (run_dir / name).read_bytes() for name in ("summary.json", "config.yaml", "metrics.jsonl")}
    capsys.readouterr()
    assert launch.main(["--resume", str(run_dir)]) == 0
    assert "is complete (2 of 2 iterations" in capsys.readouterr().out
    assert launch.main(["--resume", str(run_dir), "--set", "run.iterations=3",
                        "--set", f"prompts.source={tmp_path / 'missing.txt'}"]) == 2
    assert {name: (run_dir / name).read_bytes() for name in files} == files

    # a corrupt checkpoint is refused before Ray starts, in one line naming the file, offering the previous one
    theta = run_dir / "checkpoint" / "theta.safetensors"
    data = bytearray(theta.read_bytes())
    data[-2] ^= 0x40  # an exponent bit of the last float32
    theta.write_bytes(bytes(data))
    capsys.readouterr()
    assert launch.main(["--resume", str(run_dir), "--set", "run.iterations=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint/theta.safetensors: checksum mismatch" in err, err
    assert f"--resume {run_dir} --checkpoint previous" in err and "(iteration 1) verifies" in err, err
    plan = launch.resolve(argparse.Namespace(resume=str(run_dir), checkpoint="previous", set=["run.iterations=3"],
                                             config=None, run_dir=None))
    assert plan.resume == str(run_dir / "checkpoint.previous") and not plan.complete


def publish_through_the_object_store(learner) -> None:
    """As for a service on another node: snapshots travel as objects the service pulls from the learner."""
    learner.publisher.local = None


def test_a_restarted_sync_service_is_republished_to_then_through_the_object_store(local_ray, tmp_path,
                                                                                  restart_sync_service):
    """After iteration 0 the service restarts and the next iteration republishes to it. After iteration 1 the
    learner publishes through the object store and the service restarts again: the republish waits for the
    service to pull the snapshot from the learner (`snapshot`): both must not share one concurrency group, or
    the republish would wait for itself forever. One job of 3 iterations for both restarts (each a job of its
    own before: a job's cost is starting it); each is followed by an iteration that explores."""
    cfg, restarted, republished = config("run.iterations=3"), [], []

    def restart_service(job, metrics) -> None:
        service = next(iter(job.services.values()))
        if metrics["iteration"] == 0:
            restart_sync_service(service)
            restarted.append(0)
        if metrics["iteration"] == 1:
            ray.get(job.learner.__ray_call__.remote(publish_through_the_object_store))
            restart_sync_service(service)
            restarted.append(1)
            ref = job.learner.ensure_published.remote()
            ready, _ = ray.wait([ref], timeout=120)
            assert ready, "the republish to a restarted service did not return within 120 s"
            republished.append(ray.get(ref))

    weights, _ = run_job(cfg, tmp_path / "svc", on_iteration=restart_service)
    assert restarted == [0, 1]
    assert republished == [[next(iter(ray.nodes()))["NodeID"]]]
    assert_same(weights, single_process(cfg))


# ---- non-finite values on the Ray path ------------------------------------------------------------------
def test_nan_reward_and_nan_loss_skip_the_update_and_publish_nothing(local_ray, tmp_path):
    """Iteration 1 regenerates one NaN reward, iteration 2 computes only NaN losses: both updates are
    skipped and counted (a single NaN micro-batch is only dropped: tests/learner/test_protocol.py), the
    services' version stays where it was, and what they hold is finite."""
    versions: list[int] = []

    def inject(job, metrics) -> None:
        versions.append(ray.get(next(iter(job.services.values())).version.remote()))
        if metrics["iteration"] == 0:
            ray.get(job.learner.__ray_call__.remote(nan_reward_once))
        if metrics["iteration"] == 1:
            ray.get(job.learner.__ray_call__.remote(nan_loss_for_one_update))

    job, history = driver.run(config("run.iterations=4"), str(tmp_path / "nan"), log=lambda _: None,
                              on_iteration=inject)
    try:
        service = next(iter(job.services.values()))
        version, manifest, refs = ray.get(service.latest.remote(-1))
        if "shm" in manifest:  # on this node the snapshot lives in the service's shared-memory region
            region = Region.attach(manifest["shm"])
            try:
                _, state = region.read(lambda m, arrays: decode({k: a.copy() for k, a in arrays.items()},
                                                                Manifest.from_json(m)), version)
            finally:
                region.close()
        else:
            state = decode(ray.get(refs[0]), Manifest.from_json(manifest))
    finally:
        driver.stop(job)
    assert [bool(m.get("skipped")) for m in history] == [False, True, True, False]
    assert [m["policy_version"] for m in history] == [1, 1, 1, 2]
    assert versions == [1, 1, 1, 2]  # the service never saw a version from a skipped update
    assert [m["skipped_updates"] for m in history] == [0, 1, 2, 2]
    assert [m.get("dropped_micro_batches", 0) for m in history] == [0, 0, 1, 0]  # ⌊0.6·3⌋ = 1 trained timestep
    assert version == 2 and all(bool(torch.isfinite(t.float()).all()) for t in state.values())


# ---- elastic explorers -----------------------------------------------------------------------------------
def test_explorers_added_and_removed_while_the_job_runs_change_nothing(local_ray, tmp_path):
    """The control file asks for 2 explorers before iteration 0 (the new one loads meanwhile and joins at
    iteration 1), then for 1 again before iteration 2: the weights are those of the single process."""
    cfg, run_dir = config("run.iterations=3", "cluster.explorers.max=2"), tmp_path / "elastic"
    seen: dict[int, int] = {}

    def grow(job, _status) -> None:
        assert control.main([str(run_dir), "--explorers", "2"]) == 0

    def steer(job, metrics) -> None:
        if metrics["iteration"] == 0:
            ray.get([ref for ref in job.pool.joining])  # the new explorer has loaded: it joins at iteration 1
        if metrics["iteration"] == 1:
            seen[1] = ray.get(job.explorers[1].pid.remote())
            control_file.write_control(run_dir, explorers=1)

    launch.write_config(run_dir, cfg)  # what the launcher leaves: cluster.control reads the job's room from it
    weights, history = run_job(cfg, run_dir, on_start=grow, on_iteration=steer)
    assert [m["explorers"] for m in history] == [1, 2, 1]
    assert [m["explorers_joining"] for m in history] == [1, 0, 0]
    assert_same(weights, single_process(cfg))
    assert seen[1] > 0


def test_an_explorer_that_finds_no_room_is_reported_and_dropped_not_left_joining(local_ray, tmp_path):
    """The local Ray of these tests has 2 CPUs; the job's bundles take them all, so a third explorer can never
    be placed: after cluster.explorers.join_timeout_s the log names what it lacked, and the job goes on."""
    cfg = config("run.iterations=3", "cluster.explorers.max=2", "cluster.explorers.num_cpus=1.5",
                 "cluster.explorers.join_timeout_s=1")
    run_dir, logged = tmp_path / "crowded", []
    launch.write_config(run_dir, cfg)
    control_file.write_control(run_dir, explorers=2)

    def wait_past_the_deadline(job, metrics) -> None:
        if metrics["iteration"] == 0:
            time.sleep(1.5)

    job, history = driver.run(cfg, str(run_dir), log=logged.append, on_iteration=wait_past_the_deadline)
    driver.stop(job)
    assert [(m["explorers"], m["explorers_joining"]) for m in history] == [(1, 1), (1, 0), (1, 0)]
    reports = [line for line in logged if "was not placed and loaded within 1 s" in line]
    assert len(reports) == 1, logged  # reported once; the same target is not retried
    assert "one needs CPU 1.5, GPU 0; the cluster has CPU " in reports[0] and "staying at 1 explorer(s)" in reports[0]

