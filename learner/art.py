"""DiffusionART: aggregation-first reward tilting with adaptive restoration (arXiv 2610.12572).

Pure functions on tensors; the learner owns the models, the rollouts and the optimizer. The derivation,
and which parts are the paper's and which are this project's choices, are in docs/objectives.md.

Convention (rectified flow, as diffusion/samplers.py): x_t = (1 − t)·x0 + t·ε, v = ε − x0, t = σ ∈ [0, 1],
x̂0 = x_t − t·v. States are the ones the deterministic reverse ODE visited; t and dt are per-sample [B]
tensors (dt = t_next − t of the sampler's grid, negative; only |dt| is used).

One iteration, per prompt c with K rollouts of the sampling ("old") policy, which is also the policy at
the start of the iteration (ART runs on-policy, without an EMA-lagged sampler: config validation):

    G(c)   = art_guidance(x0[K, ...], R[K])               # Cov(R, x0 | c) normalised to unit RMS, per prompt
    a, b   = split_windows(K, generator)                  # two disjoint windows of that prompt's rollouts
    v*     = art_target(v_old(x_t), G(c))                 # frozen for the whole iteration
    window 1: art_loss(v_θ, v*, v_old, t, dt)             on the states of a  (θ = θ_old: no drift yet)
    window 2: art_loss(v_θ, v*, v_old, t, dt)             on the states of b
Window 2 replays the frozen target after window 1 moved θ: its gradient 2(v_θ − v*) = 2(drift + G)
carries a restoring force proportional to the drift, which is the source's adaptive restoration; an
explicit λ·MSE(v_θ, v_old) term would count it twice and is an extension, off by default (λ = 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

T_MIN = 1e-4
T_MAX = 1.0 - 1e-4


def pairwise_scores(rewards: torch.Tensor) -> torch.Tensor:
    """Pairwise preference scores for pairs on the last dim ([..., 2]): winner 1, loser 0, tie 0.5 each.

    A tie is exact equality of the two rewards. Output: floating tensor, same shape (float32 if the
    rewards are not floating).
    """
    if rewards.shape[-1] != 2:
        raise ValueError(f"pairwise_scores expects pairs on the last dim, got shape {tuple(rewards.shape)}")
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    first, second = rewards[..., 0], rewards[..., 1]
    first_score = torch.where(first > second, 1.0, torch.where(first < second, 0.0, 0.5)).to(dtype)
    return torch.stack([first_score, 1.0 - first_score], dim=-1)


def art_guidance(x0: torch.Tensor, rewards: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Aggregated guidance direction of one prompt, normalised: G = C / rms(C), C = Cov(R, x0) / std(R).

        z_k = (R_k − mean R) / std R          (population std; z ≡ 0 when std R < eps)
        C   = (1/K) Σ_k z_k · (x0_k − mean x0) = (1/K) Σ_k z_k · x0_k      (Σ_k z_k = 0)
        G   = C / sqrt(mean_elements C²)      (G ≡ 0 when C is)

    x0: [K, ...] final samples of the prompt; rewards: [K]. Returns G with x0's trailing shape and dtype.

    The source normalises the aggregated direction "so its strength is the same across tasks and reward
    models, and no strength coefficient needs tuning": z-scoring removes the reward's scale, the unit RMS
    removes the samples' spread and the latent's size, so every prompt's target moves x̂0 by t·G with
    rms(G) = 1 (the norm, RMS over elements, is this project's choice). Properties: invariant to R → aR + b
    (a > 0) and to permuting samples with their rewards; a < 0 flips it; all-equal rewards give exactly 0;
    with pairwise scores and K = 2, G = (x0_w − x0_l) / rms(x0_w − x0_l). Computed in float64.
    """
    if rewards.dim() != 1 or x0.shape[0] != rewards.shape[0]:
        raise ValueError(f"x0 [K, ...] and rewards [K] expected, got {tuple(x0.shape)} and {tuple(rewards.shape)}")
    k = rewards.shape[0]
    r = rewards.detach().to(torch.float64)
    centred = r - r.mean()
    std = centred.pow(2).mean().sqrt()
    if k < 2 or std.item() < eps:
        return torch.zeros_like(x0[0])
    z = centred / std
    z = z - z.mean()  # re-centre in float64 so the uncentred contraction below is the covariance
    flat = x0.detach().reshape(k, -1).to(torch.float64)
    c = (z @ flat) / k
    rms = c.pow(2).mean().sqrt()
    if rms.item() <= 1e-9 * flat.pow(2).mean().sqrt().item():  # (near-)identical samples: no direction, only
        return torch.zeros_like(x0[0])                         # rounding, which normalising would blow up
    return (c / rms).reshape(x0.shape[1:]).to(x0.dtype)


def art_target(v_ref: torch.Tensor, guidance: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Frozen regression target v* = sg(v_ref) − G (− η·G with the `scale` extension).

    v_ref: [B, ...] velocity of the reference policy (the sampling policy at the start of the iteration)
    on the visited states; guidance: G of each state's prompt, [...] (one prompt) or [B, ...]. Because
    x̂0 = x_t − t·v, the target moves the data prediction by +t·G, towards samples the reward prefers.
    G is normalised (`art_guidance`), so the source needs no strength coefficient: `scale` (η) is an
    extension of this project, None = off. No gradient flows.
    """
    guidance = guidance.detach().to(v_ref.dtype)
    return v_ref.detach() - (guidance if scale is None else scale * guidance)


def _per_sample(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] → [B, 1, ..., 1] broadcastable against `like`."""
    return x.reshape(-1, *([1] * (like.dim() - 1)))


def _mean_dims(x: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over all but the first dim: [B, ...] → [B]."""
    return x.reshape(x.shape[0], -1).mean(dim=1)


def sde_kl(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    t: torch.Tensor,
    dt: torch.Tensor,
    noise_level: float = 0.7,
) -> torch.Tensor:
    """Per-sample KL between the SDE transitions of θ and old at a visited state ([B]).

    Flow-GRPO's SDE with the same marginals as the ODE, std_t = a·sqrt(t/(1 − t)), step |Δt|:

        x_{t−|Δt|} ~ N(x_t − [v + std_t²/(2t)·(x_t + (1 − t)·v)]·|Δt|,  std_t²·|Δt|·I)

    Both policies share x_t and the variance, so only the v-dependent part of the mean differs:

        Δμ    = (v_θ − v_old)·(1 + std_t²·(1 − t)/(2t))·|Δt|
        KL_i  = mean_dims Δμ² / (2·std_t²·|Δt|)
              = (1 + a²/2)²·(1 − t)·|Δt| / (2a²·t) · mean_dims (v_θ − v_old)²

    t is clamped to [1e-4, 1 − 1e-4]: at t → 0 the SDE noise vanishes (std_t → 0, KL → ∞) and at t = 1,
    the first state of every grid, std_t² = a²·t/(1 − t) is inf and the formula gives inf·0 = NaN.
    Written in the closed form so dt = 0 gives KL = 0 instead of 0/0. Differentiable in v_θ.
    """
    a2 = noise_level**2
    tc = t.to(torch.float64).clamp(T_MIN, T_MAX)
    std2 = a2 * tc / (1.0 - tc)
    coef = 1.0 + std2 * (1.0 - tc) / (2.0 * tc)  # = 1 + a²/2, kept literal
    # Δμ²/(2·std²·|Δt|) without dividing by |Δt|
    factor = (coef**2 * dt.to(torch.float64).abs() / (2.0 * std2)).to(v_theta.dtype)
    return factor * _mean_dims((v_theta - v_old).pow(2))


TrustMask = Literal["away_from_target", "trust_region"]


def _away_from_target(drift: torch.Tensor, v_theta: torch.Tensor, v_old: torch.Tensor,
                      v_target: torch.Tensor) -> torch.Tensor:
    """⟨v_θ − v_old, v* − v_old⟩ < 0 (all [B, D], flattened per state): the drift points away from the target."""
    return (drift * (v_target - v_old)).sum(dim=1) < 0


def _update_increases_drift(drift: torch.Tensor, v_theta: torch.Tensor, v_old: torch.Tensor,
                            v_target: torch.Tensor) -> torch.Tensor:
    """⟨v_θ − v_old, v* − v_θ⟩ > 0: the regression's step, along −∇ = 2(v* − v_θ), moves v_θ further from v_old."""
    return (drift * (v_target - v_theta)).sum(dim=1) > 0


# Which states past δ a reading blocks (both are interpretations: docs/objectives.md).
TRUST_MASKS: dict[str, Callable[..., torch.Tensor]] = {
    "away_from_target": _away_from_target,
    "trust_region": _update_increases_drift,
}


@torch.no_grad()
def trust_mask(
    v_theta: torch.Tensor,
    v_old: torch.Tensor,
    v_target: torch.Tensor,
    t: torch.Tensor,
    dt: torch.Tensor,
    *,
    threshold: float = 1e-5,
    noise_level: float = 0.7,
    reading: TrustMask,
) -> torch.Tensor:
    """Per-sample trust-region mask m ([B], float 0/1; no gradient): m_i = 0 iff KL_i > δ and the reading's
    condition holds at state i.

    The source (seed 003): a state's update is masked by an ODE→SDE Gaussian KL against a fixed threshold,
    "masking only updates that drift away from the target", so that one update cannot step too far. The
    sentence reads two ways, both implemented as interpretations (`TRUST_MASKS`):

        away_from_target   ⟨v_θ − v_old, v* − v_old⟩ < 0: the state's drift so far points away from its
                           target. Blocks exactly the states whose regression would pull them back, and
                           never bounds drift towards the target.
        trust_region       ⟨v_θ − v_old, v* − v_θ⟩ > 0: the regression's step would move the state further
                           from θ_old. Past δ only corrective steps train, so window 2 adds no drift to
                           a state past δ. `ARTConfig.trust_mask`'s default: the evidence runs measured
                           it bounding drift and holding held-out accuracy (docs/objectives.md).

    With no drift (window 1, where θ = θ_old) the KL is 0 and nothing is masked in either reading.
    """
    if reading not in TRUST_MASKS:
        raise ValueError(f"unknown trust mask {reading!r}: choose one of {', '.join(TRUST_MASKS)}")
    kl = sde_kl(v_theta, v_old, t, dt, noise_level)
    drift = (v_theta - v_old).reshape(v_theta.shape[0], -1)
    blocked = TRUST_MASKS[reading](drift, v_theta.reshape(drift.shape), v_old.reshape(drift.shape),
                                   v_target.reshape(drift.shape))
    return (~((kl > threshold) & blocked)).to(v_theta.dtype)


def art_loss(
    v_theta: torch.Tensor,
    v_target: torch.Tensor,
    v_old: torch.Tensor,
    t: torch.Tensor,
    dt: torch.Tensor,
    *,
    restore_weight: float = 0.0,
    threshold: float = 1e-5,
    noise_level: float = 0.7,
    reading: TrustMask,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss of one update window on B visited states.

        L = mean_i m_i·mean_dims (v_θ − v*)²  [+  λ·mean_i mean_dims (v_θ − sg(v_old))²]

    The regression onto the frozen target is the whole loss of the source: in window 2 its gradient
    2(v_θ − v*) = 2(v_θ − v_old) + 2G already restores in proportion to the drift window 1 caused, and its
    optimum is v* itself. λ = restore_weight > 0 adds this project's extension, an explicit restoration
    (it counts the drift twice); 0 by default. m = trust_mask(...) (no gradient). Masked samples still count in the
    mean over B, so an unmasked sample's gradient does not grow when others are masked. v_target and
    v_old are detached here.

    Returns the scalar loss and detached diagnostics: masked (how many states the mask blocked), masked_fraction,
    kl_mean, kl_max, guidance_loss (the masked regression term), restore_loss (the unweighted restoration
    term: mean (v_θ − v_old)², the drift's size) and guidance_size (mean (v* − v_old)²: G's, the target's pull).
    """
    v_target = v_target.detach()
    v_old = v_old.detach()
    mask = trust_mask(v_theta, v_old, v_target, t, dt, threshold=threshold, noise_level=noise_level,
                      reading=reading)
    regression = (mask * _mean_dims((v_theta - v_target).pow(2))).mean()
    restore = _mean_dims((v_theta - v_old).pow(2)).mean()
    loss = regression + restore_weight * restore if restore_weight != 0.0 else regression
    with torch.no_grad():
        kl = sde_kl(v_theta, v_old, t, dt, noise_level)
        diagnostics = {
            "masked": (1.0 - mask).sum(),
            "masked_fraction": 1.0 - mask.mean(),
            "guidance_size": _mean_dims((v_target - v_old).pow(2)).mean(),
            "kl_mean": kl.mean(),
            "kl_max": kl.max(),
            "guidance_loss": regression.detach(),
            "restore_loss": restore.detach(),
        }
    return loss, diagnostics


def split_windows(k: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random even split of range(k) into two disjoint windows (first gets ceil(k/2)), each sorted.

    Deterministic for a seeded generator. Applied per prompt, so each prompt's rollouts are split evenly
    between the two update windows (its guidance still uses all K).
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    perm = torch.randperm(k, generator=generator)
    half = math.ceil(k / 2)
    return perm[:half].sort().values, perm[half:].sort().values
