"""Samplers for rectified-flow models: two deterministic ODE solvers and Flow-GRPO's SDE.

Convention (rectified flow): x_σ = (1 − σ)·x0 + σ·ε, the model predicts the velocity v = ε − x0,
σ runs from 1 (noise) to 0 (data). The data prediction at a state is x̂0 = x_σ − σ·v.

Both solvers walk the same σ grid, the one diffusers' `FlowMatchEulerDiscreteScheduler` builds for
the model (time shift σ' = s·σ / (1 + (s − 1)·σ) included), so Euler here is step-for-step the
diffusers / SD3 pipeline sampler. `flow_sde` is the stochastic sampler Flow-GRPO trains through
(`flow_sde_transition`): an Euler–Maruyama step of an SDE with the ODE's marginals, whose Gaussian
transitions give each step a log-probability; its noise comes from each sample's seed
(`diffusion.noise.sde_noise`). The 2nd-order multistep DPM-Solver++ is written out instead of
taken from diffusers because `DPMSolverMultistepScheduler(use_flow_sigmas=True)` uses another σ grid
and feeds the model integer timesteps; the training objectives need the exact σ the sampler visited.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

Solver = Literal["euler", "dpm2", "flow_sde"]
SOLVERS: tuple[str, ...] = ("euler", "dpm2", "flow_sde")

# velocity(x_σ, σ) with σ a float32 tensor of shape [B]
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# Which σ grid a policy walks (`model.sigma_grid`): "scheduler", the model folder's FlowMatchEuler grid with its
# shift (`flow_sigmas`, what the diffusers pipelines walk); "linspace", `linspace_sigmas`.
SigmaGrid = Literal["scheduler", "linspace"]


def linspace_sigmas(steps: int) -> torch.Tensor:
    """linspace(1, 0, steps + 1), unshifted, float32: the grid NVlabs/Sana's Sol-RL SANA recipe walks in
    exploration, regeneration and evaluation alike (`pipeline_with_logprob_sana`, diffusion/post_training/
    diffusers_patch/pipeline_with_logprob.py). diffusers' grid at shift 1 differs: linspace(1, 1/1000, steps), 0."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float32)


def flow_sigmas(steps: int, shift: float = 1.0, num_train_timesteps: int = 1000) -> torch.Tensor:
    """The σ grid of `steps` steps, float32 of length steps + 1, ending with 0.

    Built by diffusers' FlowMatchEulerDiscreteScheduler itself so it matches the pipelines bit for bit
    (including diffusers' habit of starting the linspace at the already-shifted σ_min).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift)
    scheduler.set_timesteps(steps)
    return scheduler.sigmas.to(torch.float32).clone()


@dataclass
class SampleResult:
    x0: torch.Tensor  # the final sample, float32
    sigmas: torch.Tensor  # the σ grid walked, [steps + 1]
    states: list[torch.Tensor] | None = None  # x at every σ of the grid (states[0] is the noise)
    x0_prediction: torch.Tensor | None = None  # x̂0 = x_σ − σ·v at the last step taken
    # flow_sde with states: log π(x_{i+1} | x_i) of each step taken, [B, steps] (Flow-GRPO's stored
    # sampling log-probabilities: the PPO ratio's denominator)
    log_probs: torch.Tensor | None = None


def euler_step(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    """x_{σ'} = x_σ + (σ' − σ)·v, with σ, σ' float32 scalars (the float32 difference, as diffusers)."""
    return x + (sigma_next - sigma) * v


def dpm2_step(
    x: torch.Tensor,
    x0: torch.Tensor,
    x0_prev: torch.Tensor | None,
    sigma_prev: float | None,
    sigma: float,
    sigma_next: float,
) -> torch.Tensor:
    """One DPM-Solver++(2M) step in data prediction on the flow ODE (α_σ = 1 − σ).

    With λ = log(α/σ), h = λ(σ') − λ(σ):
      x_{σ'} = (σ'/σ)·x − α_{σ'}·(e^{−h} − 1)·D,   D = (1 + 1/(2r))·x̂0 − (1/(2r))·x̂0_prev,
    r = h_prev / h. First order (D = x̂0) when there is no previous x̂0 and when σ' = 0; where
    λ(σ_prev) = −∞ (σ_prev = 1) r is infinite and D reduces to x̂0, the exact limit.
    """
    if sigma_next == 0.0:
        return x0
    alpha, alpha_next = 1.0 - sigma, 1.0 - sigma_next
    # e^{-h} = (σ'·α)/(σ·α'), well defined at α = 0 (the first step starts at σ = 1)
    exp_neg_h = (sigma_next * alpha) / (sigma * alpha_next)
    d = x0
    if x0_prev is not None and sigma_prev is not None and 0.0 < sigma_prev < 1.0:
        lam = lambda s: math.log((1.0 - s) / s)  # noqa: E731
        r = (lam(sigma) - lam(sigma_prev)) / (lam(sigma_next) - lam(sigma))
        d = (1.0 + 0.5 / r) * x0 - (0.5 / r) * x0_prev
    return (sigma_next / sigma) * x - alpha_next * (exp_neg_h - 1.0) * d


def flow_sde_transition(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor,
                        noise_level: float, sigma_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of one step x_σ → x_σ' of Flow-GRPO's SDE (σ, σ' broadcastable to x).

        std_σ = a·sqrt(σ / (1 − σ))            (σ = 1 in the denominator replaced by σ_max, the grid's
                                                largest σ below 1)
        mean  = x·(1 + std_σ²·dt / (2σ)) + v·(1 + std_σ²·(1 − σ) / (2σ))·dt,   dt = σ' − σ < 0
        x_σ'  = mean + std_σ·sqrt(−dt)·ε

    a → 0 gives the Euler step. yifan123/flow_grpo, `flow_grpo/diffusers_patch/sd3_sde_with_logprob.py`,
    `sde_step_with_logprob` (sde_type "sde"). Returns (mean, std_σ·sqrt(−dt)), in float32.
    """
    x, v, sigma, sigma_next = x.float(), v.float(), sigma.float(), sigma_next.float()
    dt = sigma_next - sigma
    std = noise_level * torch.sqrt(sigma / (1 - torch.where(sigma == 1, torch.full_like(sigma, sigma_max), sigma)))
    mean = x * (1 + std**2 / (2 * sigma) * dt) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, std * torch.sqrt(-dt)


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per sample, the mean over elements of log N(x_next; mean, scale²) ([B]); Flow-GRPO averages over
    elements rather than summing, which keeps the PPO ratio near 1 at any resolution."""
    log_p = -((x_next.detach() - mean) ** 2) / (2 * scale**2) - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    return log_p.mean(dim=tuple(range(1, log_p.dim())))


def sample_ode(
    velocity: VelocityFn,
    noise: torch.Tensor,
    sigmas: torch.Tensor,
    solver: Solver = "euler",
    *,
    return_states: bool = False,
    step_noise: Callable[[int], torch.Tensor] | None = None,
    noise_level: float = 0.7,
    sigma_max: float | None = None,
) -> SampleResult:
    """Integrate dx/dσ = v(x, σ) from σ = sigmas[0] (noise) to sigmas[-1] = 0 (`flow_sde`: its SDE,
    with `step_noise(i)` the ε of step i, `noise_level` its a and `sigma_max` the largest σ below 1 of the
    whole grid when `sigmas` is a part of it). `sigmas` may stop short of 0 (a first part of a grid):
    `x0` is then the state reached, and `x0_prediction` the data prediction of the last step.

    The state is kept in float32 whatever dtype the model runs in (as diffusers does).
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}: choose one of {', '.join(SOLVERS)}")
    if solver == "flow_sde" and step_noise is None:
        raise ValueError("the flow_sde solver needs step_noise (diffusion.noise.sde_noise for the samples' seeds)")
    x = noise.to(torch.float32)
    grid = [float(s) for s in sigmas.tolist()]
    states = [x] if return_states else None
    x0_prev: torch.Tensor | None = None
    x0_pred = x
    log_probs: list[torch.Tensor] = []
    for i in range(len(grid) - 1):
        sigma, sigma_next = grid[i], grid[i + 1]
        sigma_batch = sigmas[i].to(torch.float32).expand(x.shape[0])
        v = velocity(x, sigma_batch).to(torch.float32)
        x0_pred = x - sigma * v
        if solver == "euler":
            x = euler_step(x, v, sigmas[i], sigmas[i + 1])
        elif solver == "flow_sde":
            mean, scale = flow_sde_transition(x, v, sigmas[i], sigmas[i + 1], noise_level,
                                              grid[1] if sigma_max is None else sigma_max)
            x = mean + scale * step_noise(i).to(x.device)
            if return_states:
                log_probs.append(gaussian_log_prob(x, mean, scale))
        else:
            # The grid ends σ_min → 0 after a long stride in log-SNR (σ_min = 1/1000): a 2nd-order
            # extrapolation over it amplifies error, so the last two steps are first order.
            second_order = i > 0 and i < len(grid) - 3
            x = dpm2_step(x, x0_pred, x0_prev if second_order else None, grid[i - 1] if i > 0 else None,
                          sigma, sigma_next)
            x0_prev = x0_pred
        if states is not None:
            states.append(x)
    return SampleResult(x0=x, sigmas=sigmas, states=states, x0_prediction=x0_pred,
                        log_probs=torch.stack(log_probs, dim=1) if log_probs else None)
