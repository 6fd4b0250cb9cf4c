"""Held-out evaluation and sample grids of the trained policy, full precision, fixed seeds.

Both sample θ as evaluation sees it (`TrainingState.evaluated`: its EMA when the run keeps one) with
`eval.steps` steps, through the one sample → decode → reward path (`learner.rollouts.generate`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from diffusion.noise import eval_seeds, grid_seeds
from diffusion.policy import FlowPolicy
from diffusion.prompts import PromptSet
from learner.rollouts import Generated, Sampling, generate
from learner.training_state import TrainingState
from rewards import Reward, known_rewards


@torch.no_grad()
def evaluate(policy: FlowPolicy, state: TrainingState, reward: Reward, prompts: list[str], *, run_seed: int,
             seeds_per_prompt: int, sampling: Sampling, prompt_set: PromptSet | None = None,
             progress: Callable[[int], object] | None = None) -> dict[str, float]:
    """Mean reward (and `reported_details`) over held-out prompts × fixed seeds, one prompt's seeds per batch;
    `prompt_set`: the set the prompts come from, whose metadata the reward receives; `progress(done)`: called
    after each prompt."""
    rewards, reported = [], {}
    with state.evaluated() as model:
        for slot, prompt in enumerate(prompts):
            out = generate(policy, model, reward, prompt, eval_seeds(run_seed, slot, seeds_per_prompt), sampling,
                           metadata=prompt_set.metadata_of(prompt) if prompt_set is not None else None)
            rewards.append(out.rewards)
            for key in reported_details(out.details):
                reported.setdefault(key, []).append(out.details[key])
            if progress is not None:
                progress(slot + 1)
    return {"eval_reward": float(torch.cat(rewards).mean()),
            **{f"eval_{key}": float(torch.cat(values).mean()) for key, values in reported.items()}}


def reported_details(details: dict[str, torch.Tensor]) -> list[str]:
    """The details an evaluation reports beside its reward: `accuracy`, and every other reward's score on
    the same images (a detail named after a registered reward, e.g. digit_margin's `digit_alignment`)."""
    return [key for key in details if key == "accuracy" or key in known_rewards()]


@contextlib.contextmanager
def fixed_numerics() -> Iterator[None]:
    """One CPU thread; on CUDA no TF32, no reduced-precision reductions, deterministic cuDNN without
    autotuning. The previous settings return on exit."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    flags = [(cuda, "allow_tf32", False), (cuda, "allow_fp16_reduced_precision_reduction", False),
             (cuda, "allow_bf16_reduced_precision_reduction", False), (cudnn, "allow_tf32", False),
             (cudnn, "deterministic", True), (cudnn, "benchmark", False)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in flags]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for owner, name, value in flags:
            setattr(owner, name, value)
        yield
    finally:
        torch.set_num_threads(threads)
        for owner, name, value in saved:
            setattr(owner, name, value)


def plain_transformer(template: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A transformer of `template`'s class and config, without adapters, holding `weights` (shared, not
    copied; made on the meta device first, so nothing is initialised and no RNG is drawn)."""
    with torch.device("meta"):
        model = type(template).from_config(template.config)
    model.load_state_dict({k: v.detach().contiguous() for k, v in weights.items()}, strict=True, assign=True)
    own = dict(template.named_buffers())
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:  # a non-persistent buffer is in no state dict: take the template's own
            module, _, attribute = name.rpartition(".")
            model.get_submodule(module).register_buffer(attribute, own[name], persistent=False)
    # Constant tensors kept as plain attributes are in neither (Qwen-Image's RoPE tables, `QwenEmbedRope`).
    modules = dict(template.named_modules())
    for name, module in model.named_modules():
        for attribute, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and value.is_meta:
                setattr(module, attribute, getattr(modules[name], attribute))
    return model.eval().requires_grad_(False)


@torch.no_grad()
def evaluated_weights(state: TrainingState) -> dict[str, torch.Tensor]:
    """θ as evaluation sees it (its EMA when kept), merged into the plain transformer's keys: what
    final/transformer.safetensors holds. Never aliases θ's own parameters."""
    with state.evaluated():
        weights = state.merged_weights("theta")
        if state.mode == "full":  # θ's own tensors, which get their values back on exit
            weights = {k: v.clone() for k, v in weights.items()}
    return weights


@torch.no_grad()
def grid_samples(policy: FlowPolicy, state: TrainingState, prompts: list[str], *, run_seed: int,
                 seeds_per_prompt: int, sampling: Sampling, reward: Reward | None = None,
                 prompt_set: PromptSet | None = None, base: bool = False) -> Generated:
    """A grid's samples, rows prompt p × seeds s: images [P·S, C, H, W] (and each one's reward, when
    `reward` is given), a pure function of θ's evaluated weights and the config, whatever this process
    did before (a resumed run's grid is the undisturbed run's, byte for byte): θ is merged into a plain
    transformer — the weights final/transformer.safetensors holds — and sampled in `fixed_numerics`.
    The global RNG is not drawn from. `base`: the base model's samples instead (the reference view), the
    same prompts and seeds, for a before/after grid."""
    weights = state.merged_weights("reference") if base else evaluated_weights(state)
    model = plain_transformer(state.transformer, weights)
    seeds = [s for row in range(len(prompts)) for s in grid_seeds(run_seed, row, seeds_per_prompt)]
    per_seed = [p for p in prompts for _ in range(seeds_per_prompt)]
    metadata = prompt_set.metadata_of(per_seed) if prompt_set is not None and reward is not None else None
    with fixed_numerics():
        return generate(policy, model, reward, per_seed, seeds, sampling, return_images=True, metadata=metadata)


def sample_grid(policy: FlowPolicy, state: TrainingState, prompts: list[str], *, run_seed: int,
                seeds_per_prompt: int, sampling: Sampling, base: bool = False) -> torch.Tensor:
    """The images of `grid_samples`."""
    return grid_samples(policy, state, prompts, run_seed=run_seed, seeds_per_prompt=seeds_per_prompt,
                        sampling=sampling, base=base).images
