"""Seeds and the initial noise they define: every seed stream of a run, named in one place.

Every random choice of a run is a pure function of integers, never of shared RNG state:
`derive_seed(run_seed, iteration, slot, index)` hashes its arguments, and `initial_noise` draws a
sample's starting noise from a fresh CPU generator seeded with that sample's seed alone. So any
process, on any device, with any batch composition, rebuilds bit-identical noise for a seed, which
is what lets an explorer rank seeds in low precision and the learner regenerate the same ones.

The streams (what the four integers mean):

    candidate_seeds(run, i, slot, n)   training pools: iteration i ≥ 0, prompt slot ≥ 0, candidate j
    eval_seeds(run, slot, n)           held-out evaluation: iteration EVAL, slot = held-out prompt
    grid_seeds(run, slot, n)           sample grids: iteration GRID, slot = the grid's row
    stream_generator(run, i, Stream.X) one choice of iteration i: prompt order, selection, trained
                                       timesteps, training noise, reward shuffle, ART windows
    lora_init_seed(run)                the LoRA initialisation (iteration 0, Stream.LORA_INIT)
    sde_noise(seeds, step, shape)      the flow_sde solver's noise at one step, from each sample's seed

The embedded world's base model and reward classifier are trained by their own scripts from a seed
of their command line (`diffusion.embedded.train`, `rewards.train_digit_classifier`): they are not a
run's streams.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence

import torch

_SEED_BITS = 63  # torch.Generator.manual_seed takes up to 2**64 - 1; 63 bits stay positive everywhere

EVAL = -1  # the "iteration" of held-out evaluation seeds
GRID = -2  # the "iteration" of sample-grid seeds
SDE = -3  # the "iteration" of an SDE sampler's per-step noise (slot = the sample's seed, index = the step)


class Stream(enum.IntEnum):
    """The "slot" of a per-iteration random choice (negative: never a prompt slot)."""

    PROMPTS = -1  # which prompts fill the iteration's slots
    SELECTION = -2  # random selection modes (index = the prompt slot)
    TIMESTEPS = -3  # which of the sampler's timesteps are trained
    TRAIN_NOISE = -4  # the forward-process noise of the NFT loss
    SHUFFLE = -5  # the shuffled-reward control
    WINDOWS = -6  # DiffusionART's two windows (index = the prompt slot)
    LORA_INIT = -7  # the LoRA A matrices (iteration 0)
    OPTIMIZER_BATCHES = -8  # Flow-GRPO's shuffle of the samples into its optimizer steps


def derive_seed(run_seed: int, iteration: int, slot: int, index: int) -> int:
    """seed = blake2b(run_seed, iteration, slot, index) mod 2**63."""
    payload = struct.pack("<4q", run_seed, iteration, slot, index)
    digest = hashlib.blake2b(payload, digest_size=8, person=b"solrl-seed").digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


def candidate_seeds(run_seed: int, iteration: int, slot: int, count: int) -> list[int]:
    """The `count` candidate seeds of one prompt slot of a training iteration."""
    if iteration < 0 or slot < 0:
        raise ValueError(f"training seeds need iteration >= 0 and slot >= 0, got ({iteration}, {slot})")
    return [derive_seed(run_seed, iteration, slot, j) for j in range(count)]


def iteration_prompts(prompts: Sequence[str], run_seed: int, iteration: int, count: int) -> list[str]:
    """A training iteration's `count` prompt slots: a permutation of `prompts` seeded by (run seed,
    iteration), cycled; slot i's seeds are then `candidate_seeds(run_seed, iteration, i, N)`."""
    order = torch.randperm(len(prompts), generator=stream_generator(run_seed, iteration, Stream.PROMPTS))
    return [prompts[order[i % len(prompts)]] for i in range(count)]


def eval_seeds(run_seed: int, slot: int, count: int) -> list[int]:
    """The fixed seeds of held-out prompt `slot`: the same at every evaluation of a run."""
    return [derive_seed(run_seed, EVAL, slot, j) for j in range(count)]


def grid_seeds(run_seed: int, row: int, count: int) -> list[int]:
    """The fixed seeds of one row of a sample grid (disjoint from the evaluation's)."""
    return [derive_seed(run_seed, GRID, row, j) for j in range(count)]


def lora_init_seed(run_seed: int) -> int:
    """The seed of the LoRA A matrices' initialisation."""
    return derive_seed(run_seed, 0, int(Stream.LORA_INIT), 0)


def stream_generator(run_seed: int, iteration: int, stream: Stream, index: int = 0) -> torch.Generator:
    """A fresh CPU generator for one random choice of `iteration`."""
    return torch.Generator().manual_seed(derive_seed(run_seed, iteration, int(stream), index))


def initial_noise(
    seeds: Sequence[int],
    shape: Sequence[int],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """x_1 ~ N(0, I) of shape [len(seeds), *shape], row j drawn from a CPU generator seeded with seeds[j].

    Drawn in float32 on the CPU (bit-identical across processes and machines), then moved.
    """
    rows = []
    for seed in seeds:
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
        rows.append(torch.randn(tuple(shape), generator=generator, dtype=torch.float32))
    return torch.stack(rows).to(device=device, dtype=dtype)


def sde_noise(seeds: Sequence[int], step: int, shape: Sequence[int], *,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """ε ~ N(0, I) of an SDE sampler's step `step` for each seed: a function of (seed, step) alone, so an
    SDE rollout is as reproducible and batch-independent as the initial noise."""
    return initial_noise([derive_seed(int(seed) & ((1 << _SEED_BITS) - 1), SDE, 0, step) for seed in seeds],
                         shape, device=device)
