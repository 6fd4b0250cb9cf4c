"""The low-precision explore engine of a policy: a quantized copy of its transformer.

The engine shares everything else with the policy (prompt cache, noise, samplers): explorers sample
with `policy.sample(..., transformer=engine)`. Which Linears stay in high precision comes from the
model family (Sol-RL's per-family skip lists and minimum sizes) unless the config overrides it.
"""

from __future__ import annotations

from torch import nn

from diffusion.config import ExploreConfig
from diffusion.policy import FlowPolicy
from diffusion.quant import quantize_model


def build_explore_engine(policy: FlowPolicy, config: ExploreConfig) -> nn.Module:
    """quantize_model(transformer) with the family's skip list and minimum size, or the config's."""
    quant = policy.family.quant
    return quantize_model(
        policy.transformer,
        config.precision,
        skip=tuple(quant.skip if config.skip is None else config.skip),
        min_dim=quant.min_dim if config.min_dim is None else config.min_dim,
        backend=config.backend,
    )
