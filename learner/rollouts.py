"""The one path from seeds to scores: sample → decode → reward.

Every sampler of the system goes through `generate`: the explorers' ranking, the learner's
regeneration, the held-out evaluation, the sample grids, the demo and the benchmarks. What differs
between them is only which transformer samples (a low-precision engine, a view of the learner's
policy, a plain copy of θ) and the `Sampling` settings, built from the config in one place each.

`explore_group` is the explorer's whole job: N seeds of one prompt slot, kept as (seed, proxy
reward) pairs; images never leave it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from diffusion.policy import FlowPolicy
from diffusion.samplers import Solver
from learner.iteration_record import Work
from rewards import Metadata, Reward

if TYPE_CHECKING:
    from learner.config import TrainerConfig


@dataclass(frozen=True)
class Sampling:
    """How one kind of sampling runs: steps, solver, classifier-free guidance."""

    steps: int
    solver: Solver
    cfg_scale: float = 1.0
    batch_size: int | None = None  # samples per forward; None: all at once (results do not depend on it)
    noise_level: float = 0.7  # the flow_sde solver's a
    halving: tuple[int, int] | None = None  # a pool's (first steps, survivors): `successive_halving`; None: one pass

    def pool_steps(self, candidates: int) -> int:
        """Sample-steps of a pool of `candidates` (the explore cost `bench.convergence` prices)."""
        if self.halving is None:
            return candidates * self.steps
        first, survivors = self.halving
        return candidates * first + survivors * (self.steps - first)


def regeneration_sampling(config: TrainerConfig, solver: Solver | None = None) -> Sampling:
    """The learner's full-precision sampling (regeneration and the pools that are trained on); `solver`:
    the one the objective trains through, when it has one (`learner.updates.ObjectiveSpec.rollout_solver`)."""
    return Sampling(config.sampler.steps, solver or config.sampler.solver, config.sampler.cfg_scale,
                    noise_level=config.sampler.sde_noise_level)


def exploration_sampling(config: TrainerConfig) -> Sampling:
    """The explorers' ranking pass: the explore steps and solver (`TrainerConfig.explore_solver`)."""
    explore = config.explore
    halving = (explore.halving_steps, explore.halving_survivors) if explore.schedule == "halving" else None
    return Sampling(explore.steps, config.explore_solver, config.sampler.cfg_scale, explore.batch_size,
                    config.sampler.sde_noise_level, halving)


def evaluation_sampling(config: TrainerConfig) -> Sampling:
    """Held-out evaluation and sample grids: `eval.steps`, the sampler's solver and guidance."""
    return Sampling(config.eval.steps, config.sampler.solver, config.sampler.cfg_scale,
                    noise_level=config.sampler.sde_noise_level)


@dataclass
class RankedGroup:
    """One prompt slot's explored candidates: only seeds and scalars, a few KB for N = 96."""

    iteration: int
    slot: int
    prompt: str
    seeds: list[int]
    proxy: torch.Tensor  # float32 [N]
    policy_version: int
    seconds: float = 0.0  # sampling, decoding and scoring
    sample_s: float = 0.0  # of which denoising (the engine's forwards)
    sample_steps: int = 0  # sample-steps those took (N · explore steps; fewer with successive halving)
    syncs: int = 0  # snapshots its explorer loaded since its previous group (the driver counts the job's)
    sync_s: float = 0.0  # seconds those took (fetch and load)

    @property
    def step_s(self) -> float | None:
        """Seconds per sample-step of the engine (one denoising step of one candidate); None when unmeasured."""
        return self.sample_s / self.sample_steps if self.sample_steps else None


@dataclass
class Generated:
    seeds: list[int]
    x0: torch.Tensor  # float32 [B, C, H, W] clean samples (latents)
    rewards: torch.Tensor | None  # float32 [B]; None when no reward was asked for
    states: list[torch.Tensor] | None = None  # x at each σ of the grid, each [B, C, H, W]
    details: dict[str, torch.Tensor] = field(default_factory=dict)
    images: torch.Tensor | None = None  # [B, C, H, W] in [0, 1], when asked for
    seconds: float = 0.0
    sample_s: float = 0.0  # of `seconds`, denoising (policy.sample)
    log_probs: torch.Tensor | None = None  # [B, steps]: flow_sde's per-step log π of the sampler, with states

    def take(self, index: torch.Tensor) -> Generated:
        """The rows `index` of every per-sample field."""
        rows = index.tolist()
        return Generated(
            [self.seeds[i] for i in rows], self.x0[index],
            None if self.rewards is None else self.rewards[index],
            None if self.states is None else [s[index] for s in self.states],
            {k: v[index] for k, v in self.details.items()},
            None if self.images is None else self.images[index], self.seconds, self.sample_s,
            None if self.log_probs is None else self.log_probs[index],
        )


@dataclass
class Group:
    """What one prompt slot contributes to the update."""

    prompt: str
    samples: Generated  # the K training samples (x0, true rewards, visited states when asked)
    proxy: torch.Tensor | None  # proxy rewards of those K seeds, when a cheaper pass ranked them
    work: Work = field(default_factory=Work)  # the sample-steps spent making it (its pool's, when ranked here)


@torch.no_grad()
def generate(
    policy: FlowPolicy,
    transformer: nn.Module | None,
    reward: Reward | None,
    prompts: str | Sequence[str],
    seeds: Sequence[int],
    sampling: Sampling,
    *,
    return_states: bool = False,
    return_images: bool = False,
    metadata: Metadata | Sequence[Metadata] | None = None,
) -> Generated:
    """Sample one latent per seed (`prompts`: one per seed, or one for all), decode, score with `reward`.

    `metadata`: the prompts' metadata for the reward (`diffusion.prompts.PromptSet.metadata_of`), one
    dict per seed or one for all, like `prompts`.

    `transformer`: the module that predicts velocities (None: the policy's own); it runs in whatever
    numerics it owns (a low-precision engine enters its backend's context itself)."""
    start = time.perf_counter()
    prompts = [prompts] * len(seeds) if isinstance(prompts, str) else list(prompts)
    if isinstance(metadata, Mapping):
        metadata = [metadata] * len(seeds)
    elif metadata is not None and len(metadata) == 1 and len(seeds) > 1:
        metadata = list(metadata) * len(seeds)
    result = policy.sample(prompts, list(seeds), steps=sampling.steps, solver=sampling.solver,
                           cfg_scale=sampling.cfg_scale, transformer=transformer, return_states=return_states,
                           batch_size=sampling.batch_size, noise_level=sampling.noise_level)
    sample_s = synchronized_seconds(start, result.x0)
    images = policy.decode(result.x0) if reward is not None or return_images else None
    rewards, details = score(reward, images, prompts, metadata)
    return Generated(list(seeds), result.x0, rewards, result.states, details,
                     images if return_images else None, time.perf_counter() - start, sample_s, result.log_probs)


def synchronized_seconds(start: float, result: torch.Tensor) -> float:
    """Seconds since `start` once the device that computed `result` is done (CUDA runs asynchronously)."""
    if result.is_cuda:
        torch.cuda.synchronize(result.device)
    return time.perf_counter() - start


def score(reward: Reward | None, images: torch.Tensor | None, prompts: list[str],
          metadata: Sequence[Metadata] | None) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """The reward of decoded images (float32 [B]) and its details; (None, {}) without a reward."""
    if reward is None:
        return None, {}
    rewards, details = reward.score_and_details(images, prompts, metadata)
    return rewards.float(), details


def successive_halving(policy: FlowPolicy, engine: nn.Module | None, reward: Reward, prompt: str,
                       seeds: Sequence[int], sampling: Sampling,
                       metadata: Metadata | None = None) -> tuple[list[int], torch.Tensor, float]:
    """Adaptive exploration (this project's, not the paper's; docs/benchmarks.md measures it): every seed
    runs the first `f` steps of the explore grid and is scored on its data prediction x̂0 there; the middle
    of that ranking is dropped, and only the M survivors (the M/2 best and M/2 worst: the ones best_worst
    selection can pick) finish the grid and get their final proxy. Cost N·f + M·(S − f) sample-steps
    instead of N·S. Returns the survivors' seeds (in pool order), final proxies and denoising seconds."""
    first, survivors = sampling.halving
    prompts, seeds = [prompt] * len(seeds), list(seeds)
    meta = None if metadata is None else [metadata] * len(seeds)
    kwargs = dict(steps=sampling.steps, solver=sampling.solver, cfg_scale=sampling.cfg_scale, transformer=engine,
                  batch_size=sampling.batch_size, noise_level=sampling.noise_level)
    start = time.perf_counter()
    early = policy.sample(prompts, seeds, span=(0, first), **kwargs)
    sample_s = synchronized_seconds(start, early.x0)
    early_scores, _ = score(reward, policy.decode(early.x0_prediction), prompts, meta)
    order = torch.argsort(early_scores, descending=True, stable=True)
    kept = torch.cat([order[: survivors // 2], order[len(order) - (survivors - survivors // 2):]]).sort().values
    rows = kept.tolist()
    start = time.perf_counter()
    late = policy.sample(prompts[: len(rows)], [seeds[i] for i in rows], span=(first, sampling.steps),
                         start=early.x0[kept], **kwargs)
    sample_s += synchronized_seconds(start, late.x0)
    final, _ = score(reward, policy.decode(late.x0), prompts[: len(rows)], None if meta is None else meta[: len(rows)])
    return [seeds[i] for i in rows], final, sample_s


def explore_group(
    policy: FlowPolicy,
    engine: nn.Module | None,
    reward: Reward,
    *,
    iteration: int,
    slot: int,
    prompt: str,
    seeds: Sequence[int],
    sampling: Sampling,
    policy_version: int,
    metadata: Metadata | None = None,
) -> RankedGroup:
    """Sample every seed with the explore engine, score it, keep (seed, proxy reward); with a halving
    schedule only the survivors are kept (`successive_halving`)."""
    if sampling.halving is not None:
        start = time.perf_counter()
        kept, proxy, sample_s = successive_halving(policy, engine, reward, prompt, seeds, sampling, metadata)
        return RankedGroup(iteration, slot, prompt, kept, proxy, policy_version, time.perf_counter() - start,
                           sample_s, sampling.pool_steps(len(seeds)))
    out = generate(policy, engine, reward, prompt, seeds, sampling, metadata=metadata)
    return RankedGroup(iteration, slot, prompt, list(seeds), out.rewards, policy_version, out.seconds, out.sample_s,
                       sampling.pool_steps(len(seeds)))
