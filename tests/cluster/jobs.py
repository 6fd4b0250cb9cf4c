"""Running a job on the local Ray, and the single-process run every distributed run must reproduce."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import ray
import torch
from faults import die_in_update
from safetensors.torch import load_file
from tiny import tiny_config

from cluster.runtime import driver, learner_group
from diffusion.noise import candidate_seeds
from learner.evaluation import evaluated_weights
from learner.rollouts import exploration_sampling, explore_group
from learner.trainer import Trainer

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # theta_and_old runs inside the learners


def final_weights(job, folder) -> dict[str, torch.Tensor]:
    ray.get(job.learner.save_final.remote(str(folder)))
    return load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))


def run_job(cfg, run_dir, **kwargs):
    job, history = driver.run(cfg, str(run_dir), log=lambda _: None, **kwargs)
    try:
        return final_weights(job, run_dir / "final"), history
    finally:
        driver.stop(job)


def single_process(cfg, lagged: bool = False) -> dict[str, torch.Tensor]:
    """The single-process trainer, one thread: what every distributed run must reproduce exactly.
    lagged: iteration i ≥ 1 is ranked with the policy of the iteration before (async mode, lag 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(cfg)
        versions = {0: trainer.state.sampling_weights()}
        for iteration in range(cfg.run.iterations):
            groups = None
            if lagged and iteration > 0:
                previous = trainer.version - 1
                trainer.engine.load(versions[previous])
                groups = [
                    explore_group(trainer.policy, trainer.engine.module, trainer.reward, iteration=iteration, slot=s,
                                  prompt=p, seeds=candidate_seeds(cfg.run.seed, iteration, s, cfg.prompts.candidates),
                                  sampling=exploration_sampling(cfg), policy_version=previous,
                                  spread_reference=trainer.spread_reference)
                    for s, p in enumerate(trainer.prompts_for(iteration))]
            trainer.train_iteration(iteration, groups)
            trainer.publish()
            trainer.finish_iteration()
            versions[trainer.version] = {k: v.clone() for k, v in trainer.state.sampling_weights().items()}
        return evaluated_weights(trainer.state)
    finally:
        torch.set_num_threads(threads)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


# ---- a learner group (cluster.learner.count = 2), killed and resumed ----------------------------------------
def learner_group_config(*overrides: str):
    """Two learner ranks, three iterations: the one-machine run tests/cluster/test_several_hosts.py's three-host
    job must equal bit for bit (placement and timeouts do not enter the weights)."""
    return tiny_config("cluster.learner.count=2", "cluster.learner.collective_timeout_s=120", "run.iterations=3",
                       *overrides, ray=True)


def theta_and_old(learner) -> dict[str, torch.Tensor]:
    state = learner.trainer.state
    return {f"{view}.{k}": v.detach().clone() for view, params in (("theta", state.theta_parameters()),
                                                                    ("old", state.old_parameters()))
            for k, v in params.items()}


def killed_and_resumed_learner_group(run_dir: Path) -> dict[str, Any]:
    """Rank 1 SIGKILLed inside iteration 1's update, then the run resumed to its end. Returns what the first
    start logged and what it raised, the resumed start's history, its final weights and each rank's θ and θ_old."""
    def kill_rank_1_in_next_update(job, metrics) -> None:
        if metrics["iteration"] == 0:
            ray.get(job.learners[1].__ray_call__.remote(die_in_update))

    try:
        driver.run(learner_group_config(), str(run_dir), log=lambda _: None, on_iteration=kill_rank_1_in_next_update)
        raise AssertionError("rank 1 was killed, yet the job ended normally")
    except learner_group.LearnerDied as died:
        error = str(died)
    first = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    checkpoint = json.loads((run_dir / "checkpoint" / "meta.json").read_text())["iteration"]
    job, history = driver.run(learner_group_config(), str(run_dir), resume=True, log=lambda _: None)
    try:
        weights = final_weights(job, run_dir / "final")
        ranks = ray.get([learner.__ray_call__.remote(theta_and_old) for learner in job.learners])
    finally:
        driver.stop(job)
    return {"error": error, "first": first, "checkpoint": checkpoint, "history": history, "weights": weights,
            "ranks": ranks}
