"""The one path from seeds to scores: sample → decode → reward.

Every sampler of the system goes through `generate`: the explorers' ranking, the learner's
regeneration, the held-out evaluation, the sample grids, the demo and the benchmarks. What differs
between them is only which transformer samples (a low-precision engine, a view of the learner's
policy, a plain copy of θ) and the `Sampling` settings, built from the config in one place each.

`explore_group` is the explorer's whole job: N seeds of one prompt slot, kept as (seed, proxy
reward) pairs; images never leave it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from diffusion.config import ExploreConfig, SpreadRule
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
    spread: int | None = None  # a pool's first chunk, explored always: `spread_explore`; None: one pass
    spread_rule: SpreadRule = ExploreConfig.model_fields["spread_rule"].default  # `spread_pool_size`

    @property
    def forwards_per_step(self) -> int:
        """Transformer forwards per sample and step: 2 under classifier-free guidance (the unconditional half)."""
        return 1 if self.cfg_scale == 1.0 else 2

    def sample_steps(self, samples: int) -> int:
        """Sample-steps (one sample through one forward) of `samples` whole samplings: the work the cost model
        prices, so a guided step counts twice."""
        return samples * self.steps * self.forwards_per_step

    def pool_steps(self, candidates: int) -> int:
        """Sample-steps of a pool of `candidates` (the explore cost `bench.convergence` prices); with a
        spread schedule `candidates` is the pool a slot took (`spread_explore`: its first chunk, or all N)."""
        if self.halving is None:
            return self.sample_steps(candidates)
        first, survivors = self.halving
        return (candidates * first + survivors * (self.steps - first)) * self.forwards_per_step


def regeneration_sampling(config: TrainerConfig, solver: Solver | None = None) -> Sampling:
    """The learner's full-precision sampling (regeneration and the pools that are trained on); `solver`:
    the one the objective trains through, when it has one (`learner.updates.ObjectiveSpec.rollout_solver`)."""
    return Sampling(config.sampler.steps, solver or config.sampler.solver, config.sampler.cfg_scale,
                    noise_level=config.sampler.sde_noise_level)


def exploration_sampling(config: TrainerConfig) -> Sampling:
    """The explorers' ranking pass: the explore steps and solver (`TrainerConfig.explore_solver`)."""
    explore = config.explore
    halving = (explore.halving_steps, explore.halving_survivors) if explore.schedule == "halving" else None
    spread = explore.spread_first if explore.schedule == "spread" else None
    return Sampling(explore.steps, config.explore_solver, config.sampler.cfg_scale, explore.batch_size,
                    config.sampler.sde_noise_level, halving, spread, explore.spread_rule)


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
    sample_steps: int = 0  # sample-steps those took (N · explore steps; fewer with halving or a spread pool)
    scored: int = 0  # images decoded and scored by the reward (N; N + M with successive halving)
    syncs: int = 0  # snapshots its explorer loaded since its previous group (the driver counts the job's)
    sync_s: float = 0.0  # seconds those took (fetch and load)
    first_spread: float | None = None  # spread schedule: std of the first chunk's proxies (`spread_reference`)

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
    first_spread: float | None = None  # its ranked group's (spread schedule): the next iteration's reference


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
    instead of N·S, and N + M images decoded and scored (every seed at the cut, the survivors again at the
    end) instead of N. Returns the survivors' seeds (in pool order), final proxies and denoising seconds."""
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


def first_chunk_spread(proxy: torch.Tensor) -> float:
    """The spread of a prompt's first chunk of proxy rewards: their std (unbiased; NaN when one is NaN)."""
    return float(proxy.double().std())


def spread_pool_size(spread: float, reference: float | None, first: int, candidates: int,
                     rule: SpreadRule) -> int:
    """How many candidates a slot explores under the spread schedule; all `candidates` when there is no
    reference (iteration 0, or a checkpoint without one). Rule "median": all when its first chunk's
    `spread` reaches `reference`, else only the `first`. Rule "proportional": (first + candidates)/2 ·
    spread ÷ reference, rounded, within [first, candidates] — the allocation that equalizes the marginal
    gain σ·g'(n) when the best/worst gap g(n) of a pool grows like log n, so a prompt at the median takes
    the mean pool and similar spreads give similar pools. A NaN spread (a broken reward) keeps the first
    chunk."""
    if reference is None:
        return candidates
    if rule == "median":
        return candidates if spread >= reference else first
    if rule != "proportional":
        raise ValueError(f"unknown spread rule {rule!r}: median or proportional")
    if math.isnan(spread):
        return first
    if reference <= 0 or math.isinf(spread):  # a reference of 0: the previous chunks' rewards were all equal
        return candidates
    return min(candidates, max(first, round((first + candidates) / 2 * spread / reference)))


def spread_reference(spreads: Iterable[float | None]) -> float | None:
    """The next iteration's reference: the median of the first-chunk spreads of an iteration's slots (every
    slot's `first_spread`, whatever its pool; non-finite ones left out); None when none has one. A pure
    function of the iteration's groups, so the driver, every learner rank and a resumed run agree on it."""
    spreads = sorted(s for s in spreads if s is not None and math.isfinite(s))
    if not spreads:
        return None
    middle = len(spreads) // 2
    return spreads[middle] if len(spreads) % 2 else (spreads[middle - 1] + spreads[middle]) / 2


def spread_explore(policy: FlowPolicy, engine: nn.Module | None, reward: Reward, prompt: str, seeds: Sequence[int],
                   sampling: Sampling, reference: float | None,
                   metadata: Metadata | None = None) -> tuple[list[int], torch.Tensor, float, float, float]:
    """Adaptive exploration by spread (this project's, not the paper's; docs/benchmarks.md measures it): the
    first `sampling.spread` seeds are explored and scored; the slot explores more of its N by the std of
    those proxies against `reference` (the previous iteration's median over slots, `spread_reference`), by
    `sampling.spread_rule` (`spread_pool_size`: all or nothing at the median, or in proportion).
    Best/worst selection gains from a bigger pool in proportion to the prompt's reward spread σ (the kept
    extremes move by ≈ σ·(E[top-K/2 mean of N] − E[of F])), at a fixed cost per seed: the seeds go where σ is
    large. Every seed takes every explore step and is scored once, and the pool is a prefix of the candidate
    list, so its seeds stay derived from (run seed, iteration, slot, index). The first chunk is always sampled
    and scored alone, so its proxies do not depend on the decision. Returns the pool's seeds, their proxies,
    the first chunk's spread, and the seconds spent (all, and of them denoising)."""
    first, seeds = sampling.spread, list(seeds)
    head = generate(policy, engine, reward, prompt, seeds[:first], sampling, metadata=metadata)
    spread = first_chunk_spread(head.rewards)
    size = spread_pool_size(spread, reference, first, len(seeds), sampling.spread_rule)
    proxy, seconds, sample_s = head.rewards, head.seconds, head.sample_s
    if size > first:
        tail = generate(policy, engine, reward, prompt, seeds[first:size], sampling, metadata=metadata)
        proxy, seconds, sample_s = torch.cat([proxy, tail.rewards]), seconds + tail.seconds, sample_s + tail.sample_s
    return seeds[:size], proxy, spread, seconds, sample_s


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
    spread_reference: float | None = None,
) -> RankedGroup:
    """Sample every seed with the explore engine, score it, keep (seed, proxy reward); with a halving
    schedule only the survivors are kept (`successive_halving`); with a spread schedule the pool is the
    first chunk or all of `seeds`, by `spread_reference` (`spread_explore`)."""
    if sampling.spread is not None:
        kept, proxy, spread, seconds, sample_s = spread_explore(policy, engine, reward, prompt, seeds, sampling,
                                                                spread_reference, metadata)
        return RankedGroup(iteration, slot, prompt, kept, proxy, policy_version, seconds, sample_s,
                           sampling.pool_steps(len(kept)), scored=len(kept), first_spread=spread)
    if sampling.halving is not None:
        start = time.perf_counter()
        kept, proxy, sample_s = successive_halving(policy, engine, reward, prompt, seeds, sampling, metadata)
        return RankedGroup(iteration, slot, prompt, kept, proxy, policy_version, time.perf_counter() - start,
                           sample_s, sampling.pool_steps(len(seeds)), scored=len(seeds) + len(kept))
    out = generate(policy, engine, reward, prompt, seeds, sampling, metadata=metadata)
    return RankedGroup(iteration, slot, prompt, list(seeds), out.rewards, policy_version, out.seconds, out.sample_s,
                       sampling.pool_steps(len(seeds)), scored=len(seeds))
