"""Seeds and the initial noise they define.

Every random choice of a run is a pure function of integers, never of shared RNG state:
`derive_seed(run_seed, iteration, slot, index)` hashes its arguments, and `initial_noise` draws a
sample's starting noise from a fresh CPU generator seeded with that sample's seed alone. So any
process, on any device, with any batch composition, rebuilds bit-identical noise for a seed, which
is what lets an explorer rank seeds in low precision and the learner regenerate the same ones.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

_SEED_BITS = 63  # torch.Generator.manual_seed takes up to 2**64 - 1; 63 bits stay positive everywhere


def derive_seed(run_seed: int, iteration: int, slot: int, index: int) -> int:
    """seed = blake2b(run_seed, iteration, slot, index) mod 2**63.

    `slot` is the prompt slot of the iteration, `index` the candidate within the slot. Negative
    iteration or slot values name special streams (e.g. evaluation uses iteration = -1).
    """
    payload = struct.pack("<4q", run_seed, iteration, slot, index)
    digest = hashlib.blake2b(payload, digest_size=8, person=b"solrl-seed").digest()
    return int.from_bytes(digest, "little") & ((1 << _SEED_BITS) - 1)


def derive_seeds(run_seed: int, iteration: int, slot: int, count: int) -> list[int]:
    """The `count` candidate seeds of one prompt slot."""
    return [derive_seed(run_seed, iteration, slot, j) for j in range(count)]


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
