"""Running a job on the local Ray, and the single-process run every distributed run must reproduce."""

from __future__ import annotations

import ray
import torch
from safetensors.torch import load_file

from cluster.runtime import driver
from diffusion.noise import candidate_seeds
from learner.evaluation import evaluated_weights
from learner.rollouts import exploration_sampling, explore_group
from learner.trainer import Trainer


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
