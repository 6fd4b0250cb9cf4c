"""Rollouts: rank a prompt's seeds cheaply, then (re)generate the chosen ones for training.

`explore_group` is the explorer's whole job — N seeds of one prompt slot through a sampler and a
reward, kept as (seed, proxy reward) pairs; images never leave it. `generate` samples chosen seeds
with a given transformer and returns what training needs (clean samples, rewards, visited states).
Both are plain functions of a policy, a transformer view and a reward, so the single-process trainer
and the Ray actors call the very same code.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from diffusion.policy import FlowPolicy
from rewards import Reward


@dataclass
class RankedGroup:
    """One prompt slot's explored candidates: only seeds and scalars, a few KB for N = 96."""

    iteration: int
    slot: int
    prompt: str
    seeds: list[int]
    proxy: torch.Tensor  # float32 [N]
    policy_version: int
    seconds: float = 0.0


@dataclass
class Generated:
    seeds: list[int]
    x0: torch.Tensor  # float32 [K, C, H, W] clean samples
    rewards: torch.Tensor  # float32 [K]
    states: list[torch.Tensor] | None = None  # x at each σ of the grid, each [K, C, H, W]
    details: dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0


def score(reward: Reward, policy: FlowPolicy, latents: torch.Tensor, prompts: Sequence[str]):
    """Decode and score: (rewards [B], per-sample details)."""
    images = policy.decode(latents)
    if hasattr(reward, "score_and_details"):
        return reward.score_and_details(images, list(prompts))
    return reward(images, list(prompts)), {}


def generate(
    policy: FlowPolicy,
    transformer: nn.Module | None,
    reward: Reward,
    prompt: str,
    seeds: Sequence[int],
    *,
    steps: int,
    solver: str,
    return_states: bool = False,
) -> Generated:
    start = time.perf_counter()
    prompts = [prompt] * len(seeds)
    result = policy.sample(prompts, list(seeds), steps=steps, solver=solver, transformer=transformer,
                           return_states=return_states)
    rewards, details = score(reward, policy, result.x0, prompts)
    return Generated(list(seeds), result.x0, rewards.float(), result.states, details, time.perf_counter() - start)


def explore_group(
    policy: FlowPolicy,
    engine: nn.Module | None,
    reward: Reward,
    *,
    iteration: int,
    slot: int,
    prompt: str,
    seeds: Sequence[int],
    steps: int,
    solver: str,
    policy_version: int,
) -> RankedGroup:
    """Sample every seed with the explore engine, score it, keep (seed, proxy reward)."""
    out = generate(policy, engine, reward, prompt, seeds, steps=steps, solver=solver)
    return RankedGroup(iteration, slot, prompt, list(seeds), out.rewards, policy_version, out.seconds)
