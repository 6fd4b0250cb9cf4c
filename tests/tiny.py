"""The tiny scale every test that trains runs at, in one place so the suites stay comparable.

TINY: 2 prompts × 8 candidates, keep 4, 4 sampler / 3 explore / 4 evaluation steps, a rank-4 LoRA.
ON_RAY: fewer steps for a 2-core local Ray, half a CPU and one torch thread per actor (one thread
everywhere is what makes actors and the single-process reference agree bit for bit).
"""

from __future__ import annotations

from cluster.config.loading import load_config
from cluster.config.schema import SolRLConfig

TINY = [
    "prompts.per_iteration=2", "prompts.candidates=8", "prompts.keep=4", "sampler.steps=4", "explore.steps=3",
    "eval.every=0", "eval.prompts=2", "eval.seeds_per_prompt=2", "eval.steps=4", "training.lora_rank=4",
    "training.lora_alpha=8", "learner.micro_batch=64", "run.checkpoint_every=1",
]
ON_RAY = [
    "sampler.steps=3", "explore.steps=2", "eval.steps=3", "run.iterations=2", "cluster.explorers.num_cpus=0.5",
    "cluster.learner.num_cpus=0.5", "cluster.explorers.threads=1", "cluster.learner.threads=1",
]


def tiny_sets(*extra: str, ray: bool = False) -> list[str]:
    """The `--set` values of the tiny scale (sized for Ray with `ray`), then `extra`."""
    return [*TINY, *(ON_RAY if ray else ()), *extra]


def tiny_config(*extra: str, ray: bool = False) -> SolRLConfig:
    return load_config("configs/embedded.yaml", tiny_sets(*extra, ray=ray))


def tiny_family_sets(folder, *extra: str, ray: bool = True) -> list[str]:
    """The tiny scale on a family's tiny pipeline (`diffusion.tiny`) in latent space: 32 px images (FLUX's
    default would be the pipeline's 1024 px), prompt files, the JPEG-compressibility reward (the digit
    classifier only reads the embedded world), every layer eligible for the engine (the tiny layers are far
    below the real minimum sizes)."""
    return tiny_sets(f"model.path={folder}", "model.resolution=32", "prompts.source=configs/prompts/train.txt",
                     "prompts.eval_source=configs/prompts/heldout.txt", "reward.weights={jpeg_compressibility: 1.0}",
                     "explore.min_dim=0", *extra, ray=ray)


def tiny_family_config(folder, *extra: str, ray: bool = False) -> SolRLConfig:
    """`tiny_family_sets` as a config."""
    return load_config("configs/embedded.yaml", tiny_family_sets(folder, *extra, ray=ray))
