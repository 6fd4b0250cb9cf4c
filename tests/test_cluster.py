"""The distributed job on a real local Ray cluster: equivalence, faults, metrics.

Every process runs torch with one thread, so the learner actor, the explorers and the single-process
reference compute bit for bit the same thing.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest
import ray
import torch
from safetensors.torch import load_file

from cluster import driver
from cluster.config import load_config
from learner.trainer import Trainer
from weight_sync.service import service_name

SMALL = [
    "prompts.per_iteration=2", "prompts.candidates=8", "prompts.keep=4", "sampler.steps=3", "explore.steps=2",
    "eval.every=0", "eval.prompts=2", "eval.seeds_per_prompt=2", "training.lora_rank=4", "training.lora_alpha=8",
    "run.iterations=2", "run.checkpoint_every=1", "cluster.explorers.num_cpus=0.5", "cluster.learner.num_cpus=0.5",
    "cluster.explorers.threads=1", "cluster.learner.threads=1",
]


def config(*overrides: str):
    return load_config("configs/embedded.yaml", SMALL + list(overrides))


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def final_weights(job, folder) -> dict[str, torch.Tensor]:
    ray.get(job.learner.save_final.remote(str(folder)))
    return load_file(str(folder / "transformer.safetensors"))


def run_job(cfg, run_dir, **kwargs):
    job, history = driver.run(cfg, str(run_dir), log=lambda _: None, **kwargs)
    weights = final_weights(job, run_dir / "final")
    driver.stop(job)
    return weights, history


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory):
    """The single-process trainer, one thread: what every distributed run must reproduce exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(config())
        trainer.run(log=lambda _: None)
        return {k: v.clone() for k, v in trainer.state.merged_weights("theta").items()}
    finally:
        torch.set_num_threads(threads)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_one_and_two_explorers_give_the_single_process_weights(local_ray, tmp_path, reference_weights):
    one, history = run_job(config("cluster.explorers.count=1"), tmp_path / "one")
    two, _ = run_job(config("cluster.explorers.count=2"), tmp_path / "two")
    assert_same(one, reference_weights)
    assert_same(two, reference_weights)
    assert [m["iteration"] for m in history] == [0, 1] and history[-1]["policy_version"] == 2
    assert all("rank_spearman" in m for m in history)
    assert 0 < history[1]["learner_idle_fraction"] < 1  # it waited for the explorers of iteration 1


def test_lora_codec_and_reward_scorer_actors_change_nothing(local_ray, tmp_path, reference_weights):
    """Explorers merge the shipped adapter into their own base; a RewardScorer actor scores for them."""
    weights, history = run_job(config("cluster.codec=lora", "cluster.scorers.count=1",
                                      "cluster.scorers.num_cpus=0.25"), tmp_path / "lora")
    assert weights.keys() == reference_weights.keys()
    for key, value in reference_weights.items():  # the merge runs in another process: equal to fp32 rounding
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6)
    assert all("rank_spearman" in m for m in history)


def test_async_mode_explores_ahead_and_stays_on_policy(local_ray, tmp_path, reference_weights):
    _, history = run_job(config("cluster.mode=async", "cluster.max_policy_lag=1"), tmp_path / "async")
    lags = [m["policy_lag"] for m in history]
    assert lags[0] == 0 and all(lag <= 1 for lag in lags)
    # whatever version ranked the seeds, the learner regenerated them with its own current policy
    assert [m["sampled_with_version"] for m in history] == [0, 1]
    assert all(m["fp_sample_steps"] == 2 * 4 * 3 for m in history)

    # max lag 0: every group explored ahead is stale, dropped (counted) and explored again, which
    # makes the run exactly the synchronous one
    weights, history = run_job(config("cluster.mode=async", "cluster.max_policy_lag=0"), tmp_path / "async0")
    assert sum(m.get("dropped_groups", 0) for m in history) >= 1
    assert_same(weights, reference_weights)


def test_a_killed_explorer_is_restarted_and_changes_nothing(local_ray, tmp_path, reference_weights):
    killed: list[int] = []

    def kill_first_explorer(job, _metrics) -> None:
        if not killed:  # after iteration 0: kill explorer 0's process; iteration 1 needs it again
            pid = ray.get(job.explorers[0].pid.remote())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    job, history = driver.run(config("cluster.explorers.count=2"), str(tmp_path / "killed"), log=lambda _: None,
                              on_iteration=kill_first_explorer)
    weights = final_weights(job, tmp_path / "killed" / "final")
    deadline = time.time() + 120
    while True:  # the explorer comes back (it reloads the model and the newest weights)
        try:
            new_pid = ray.get(job.explorers[0].pid.remote())
            break
        except ray.exceptions.ActorUnavailableError:
            assert time.time() < deadline, "the killed explorer did not restart"
            time.sleep(0.5)
    driver.stop(job)
    assert killed and new_pid != killed[0]
    assert history[1].get("redispatched_slots", 0) >= 1  # its slot of iteration 1 went to the other one
    assert_same(weights, reference_weights)


def test_a_killed_learner_resumes_bitwise(local_ray, tmp_path, reference_weights):
    cfg = config()
    job, _ = driver.run(cfg.model_copy(update={"run": cfg.run.model_copy(update={"iterations": 1})}),
                        str(tmp_path / "run"), log=lambda _: None)
    ray.kill(job.learner)  # the learner dies after its first checkpoint
    driver.stop(job)
    weights, history = run_job(cfg, tmp_path / "run", resume=True)
    assert [m["iteration"] for m in history] == [1]
    assert_same(weights, reference_weights)


def test_a_restarted_sync_service_is_republished_to(local_ray, tmp_path, reference_weights, restart_sync_service):
    node = ray.get_runtime_context().get_node_id()
    restarted = []

    def restart_service(_job, _metrics) -> None:
        if not restarted:
            service = ray.get_actor(service_name(node))
            restart_sync_service(service)
            restarted.append(True)

    job, _ = driver.run(config(), str(tmp_path / "svc"), log=lambda _: None, on_iteration=restart_service)
    weights = final_weights(job, tmp_path / "svc" / "final")
    driver.stop(job)
    assert restarted
    assert_same(weights, reference_weights)


def test_dashboard_metrics_are_exported(local_ray, tmp_path):
    run_job(config(), tmp_path / "metrics")
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
    deadline, text = time.time() + 30, ""
    while time.time() < deadline and "ray_solrl_policy_version" not in text:
        time.sleep(2)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("ray_solrl_") and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            values[name] = float(line.rsplit(" ", 1)[1])
    for name in ("ray_solrl_reward_mean", "ray_solrl_policy_version", "ray_solrl_train_seconds",
                 "ray_solrl_sync_seconds", "ray_solrl_rank_spearman", "ray_solrl_learner_idle_fraction",
                 "ray_solrl_candidates_per_second", "ray_solrl_explored_candidates_total"):
        assert name in values, (name, sorted(values)[:20])
    assert values["ray_solrl_policy_version"] >= 1
    assert values["ray_solrl_reward_mean"] <= 0  # log-probabilities
    assert 0 <= values["ray_solrl_learner_idle_fraction"] <= 1
    assert values["ray_solrl_train_seconds"] > 0
