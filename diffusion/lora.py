"""A LoRA adapter merged into its base weight: W + scale·(B @ A), summed in float32, rounded once.

The learner merges θ_old's adapters for a dense snapshot (peft computes each layer's delta) and an
explorer merges the adapters a `lora` snapshot carries into its own base weights: one rule for the sum
and its rounding, whichever side merges.
"""

from __future__ import annotations

import torch


def add_delta(weight: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """W + ΔW computed in float32 and rounded once to W's dtype."""
    return (weight.float() + delta.float()).to(weight.dtype)


def merge_lora(
    base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """W + scale·(B @ A) for every adapted layer "<layer>.lora_A.weight" / "<layer>.lora_B.weight"."""
    merged = {}
    for key in adapters:
        if not key.endswith(".lora_A.weight"):
            continue
        layer = key.removesuffix(".lora_A.weight")
        delta = (adapters[f"{layer}.lora_B.weight"] @ adapters[key]) * scale
        merged[f"{layer}.weight"] = add_delta(base[f"{layer}.weight"], delta)
    return merged
