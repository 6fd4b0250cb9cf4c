"""Training objectives on tensors: DiffusionNFT here; DiffusionART in `learner.art`, Flow-GRPO in `learner.flow_grpo`.

Rectified flow: x_t = (1 − t)·x0 + t·ε, velocity v = ε − x0, data prediction x̂0 = x_t − t·v.
DiffusionNFT trains only on clean samples x0, re-noised on the forward process at the sampler's own
timesteps; the sampler is a black box.
"""

from __future__ import annotations

from typing import Literal

import torch

Objective = Literal["nft", "art", "flow_grpo"]  # the update loops of each: `learner.updates.OBJECTIVES`

__all__ = ["Objective", "nft_loss", "nft_optimality", "trained_timestep_indices"]


def nft_optimality(advantages: torch.Tensor, adv_clip_max: float = 5.0) -> torch.Tensor:
    """r = clamp(clip(A, −c, c)/c/2 + 1/2, 0, 1), the "optimality probability" of each sample."""
    return (advantages.clamp(-adv_clip_max, adv_clip_max) / adv_clip_max / 2.0 + 0.5).clamp(0.0, 1.0)


def _adaptive_x0_loss(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """Per sample: mean((x̂0 − x0)²) / w, w = stopgrad(mean|x̂0 − x0|) clamped ≥ 1e-5.

    w is float64, as in the official code, so the per-sample losses come out in float64.
    """
    dims = tuple(range(1, x0.dim()))
    with torch.no_grad():
        weight = (x0_pred.double() - x0.double()).abs().mean(dim=dims, keepdim=True).clamp(min=1e-5)
    return ((x0_pred - x0) ** 2 / weight).mean(dim=dims)


def nft_loss(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    v_ref: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    t: torch.Tensor,
    advantages: torch.Tensor,
    *,
    beta: float = 1.0,
    adv_clip_max: float = 5.0,
    kl_weight: float = 1e-4,
) -> torch.Tensor:
    """The DiffusionNFT loss of one batch of re-noised samples (t of shape [B] in [0, 1]; scalar result).

        r  = clamp(clip(A, −c, c)/c/2 + 1/2, 0, 1)                    c = adv_clip_max
        v⁺ = β·v_θ + (1 − β)·v_old          v⁻ = (1 + β)·v_old − β·v_θ
        x̂0^± = x_t − t·v^±                  L^± = mean((x̂0^± − x0)²) / sg(mean|x̂0^± − x0|)   (per sample)
        loss = c · mean_b[(r·L⁺ + (1 − r)·L⁻) / β] + kl_weight · mean((v_θ − v_ref)²)

    v_old and v_ref come from the sampling policy and the base model without gradients. At r = ½
    and v_θ = v_old the gradient vanishes; r > ½ pulls v_θ towards the sample's own velocity, r < ½
    pushes it away (per-sample optimum v* = v_old + (2r − 1)(v − v_old)/β).
    """
    if t.dim() != 1 or t.shape[0] != x0.shape[0]:
        raise ValueError(f"t must have shape [B] = [{x0.shape[0]}], got {tuple(t.shape)}")
    t_ = t.view(-1, *([1] * (x0.dim() - 1))).to(v_theta.dtype)
    v_old, v_ref = v_old.detach(), v_ref.detach()
    r = nft_optimality(advantages, adv_clip_max)
    positive = _adaptive_x0_loss(x_t - t_ * (beta * v_theta + (1.0 - beta) * v_old), x0)
    negative = _adaptive_x0_loss(x_t - t_ * ((1.0 + beta) * v_old - beta * v_theta), x0)
    policy = ((r * positive + (1.0 - r) * negative) / beta * adv_clip_max).mean()
    return policy + kl_weight * ((v_theta - v_ref) ** 2).mean()


def trained_timestep_indices(
    num_samples: int, steps: int, fraction: float, generator: torch.Generator
) -> torch.Tensor:
    """[num_samples, ⌊fraction·steps⌋] indices into the sampler's σ grid: each sample's own shuffle."""
    count = int(fraction * steps)
    if not 1 <= count <= steps:
        raise ValueError(f"timestep fraction {fraction} of {steps} steps trains {count} timesteps: need 1..{steps}")
    return torch.stack([torch.randperm(steps, generator=generator)[:count] for _ in range(num_samples)])
