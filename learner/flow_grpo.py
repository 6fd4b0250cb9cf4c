"""The Flow-GRPO objective on tensors (Liu et al. 2025; yifan123/flow_grpo `scripts/train_sd3.py`, the
"grpo logic" of the training loop): PPO's clipped ratio on the per-step log-probabilities of an SDE
rollout, with a KL to the reference policy.

The rollout is sampled with `diffusion.samplers.flow_sde_transition` (the `flow_sde` solver): each step
x_σ → x_σ' is Gaussian with mean μ_π(x_σ) and scale s = std_σ·sqrt(−dt), so a trained step has

    log π(x_σ' | x_σ)  = mean over elements of log N(x_σ'; μ_π, s²)        (diffusion.samplers.gaussian_log_prob)
    ratio              = exp(log π_θ − log π_old)
    A                  = clip(advantage, −c, c)
    policy             = mean_b max(−A·ratio, −A·clip(ratio, 1 − ε, 1 + ε))
    KL                 = mean_b [mean over elements (μ_θ − μ_ref)²] / (2·std_σ²)
    loss               = policy + β·KL

Defaults of the source (`config/base.py`, `config/grpo.py`): ε = 1e-4, c = 5, a = 0.7, β per reward (0.04
for GenEval and OCR, 0.02 for CLIPScore, 0.01 for PickScore: `learner.config.GRPO_KL_WEIGHTS`).
"""

from __future__ import annotations

import torch


def flow_grpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean_theta: torch.Tensor,
    mean_ref: torch.Tensor,
    std: torch.Tensor,
    *,
    clip_range: float = 1e-4,
    adv_clip_max: float = 5.0,
    kl_weight: float = 0.04,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch of trained steps (all [B] but the means, [B, ...]; `std` is std_σ, [B])
    and its diagnostics: the mean ratio, the clipped fraction (|ratio − 1| > ε) and the approximate KL
    ½·mean((log π_θ − log π_old)²), as the source logs them."""
    advantages = advantages.clamp(-adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    if kl_weight > 0:
        dims = tuple(range(1, mean_theta.dim()))
        kl = ((mean_theta - mean_ref.detach()) ** 2).mean(dim=dims) / (2 * std.view(-1) ** 2)
        loss = loss + kl_weight * kl.mean()
    with torch.no_grad():
        diagnostics = {"ratio_mean": ratio.mean(),
                       "clip_fraction": ((ratio - 1.0).abs() > clip_range).float().mean(),
                       "approx_kl": 0.5 * ((log_prob - old_log_prob) ** 2).mean()}
    return loss, diagnostics
