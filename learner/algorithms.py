"""The paper's four algorithms, as data: what is explored, and what the update trains on.

    algorithm      explore (ranks N seeds)               trained on
    diffusionnft   —                                     K seeds sampled in full precision (K-in-K)
    naive_scaling  N seeds, full precision, train steps  the K selected samples themselves
    naive_quant    N seeds, low precision, train steps   the K selected low-precision samples
    sol_rl         N seeds, low precision, explore steps the K selected seeds regenerated in full precision

(Sol-RL paper, Table 1 and §4; the official configs in NVlabs/Sana `train_scripts/sol_rl/`.) The
trainer reads one of these records; no phase branches on an algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Algorithm = Literal["diffusionnft", "naive_scaling", "naive_quant", "sol_rl"]


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    explore: Literal["full", "low"] | None  # the precision the pool of N seeds is sampled in; None: no pool
    explore_steps: Literal["sampler", "explore"]  # whose step count the pool uses
    regenerate: bool  # True: the kept seeds are sampled again in full precision; False: the pool's samples

    @property
    def remote_explore(self) -> bool:
        """Whether explorer actors can rank the pool (only seeds and proxy rewards travel)."""
        return self.explore == "low" and self.regenerate


ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec("diffusionnft", explore=None, explore_steps="sampler", regenerate=True),
        AlgorithmSpec("naive_scaling", explore="full", explore_steps="sampler", regenerate=False),
        AlgorithmSpec("naive_quant", explore="low", explore_steps="sampler", regenerate=False),
        AlgorithmSpec("sol_rl", explore="low", explore_steps="explore", regenerate=True),
    )
}
