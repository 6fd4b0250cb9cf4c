"""Flow-GRPO: its SDE sampler (marginals, noise from the seed, log-probabilities), its loss, its place in
the trainer and the config."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion.noise import sde_noise
from diffusion.samplers import flow_sde_transition, gaussian_log_prob, sample_ode
from learner.flow_grpo import flow_grpo_loss

SIGMAS = torch.linspace(1.0, 0.0, 41)


def gaussian_data_velocity(scale: float):
    """The exact velocity field of data x0 ~ N(0, scale²): v(x, σ) = E[ε − x0 | x_σ = x]."""

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        s = sigma.view(-1, *([1] * (x.dim() - 1)))
        variance = (1 - s) ** 2 * scale**2 + s**2
        return (s - (1 - s) * scale**2) / variance * x

    return velocity


def test_the_sde_keeps_the_odes_marginals_on_gaussian_data() -> None:
    """With the exact velocity of N(0, 0.5²) data, the ODE and Flow-GRPO's SDE both end at std 0.5 (200
    steps; 1e5 samples give a standard error of 0.001): the drift correction std²/(2σ)·(x + (1 − σ)·v) is
    what keeps the marginals."""
    n, g = 100_000, torch.Generator().manual_seed(0)
    sigmas, noise, velocity = torch.linspace(1.0, 0.0, 201), torch.randn(n, 1, generator=g), gaussian_data_velocity(0.5)
    ode = sample_ode(velocity, noise, sigmas, "euler").x0
    sde = sample_ode(velocity, noise, sigmas, "flow_sde", step_noise=lambda i: torch.randn(n, 1, generator=g),
                     noise_level=0.7).x0
    assert float(ode.std()) == pytest.approx(0.5, abs=0.005)
    assert float(sde.std()) == pytest.approx(0.5, abs=0.005)
    assert float((sde - ode).abs().mean()) > 0.1  # the SDE did sample something else


def test_the_sde_tends_to_euler_as_the_noise_level_vanishes() -> None:
    noise = torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    velocity = gaussian_data_velocity(0.7)
    euler = sample_ode(velocity, noise, SIGMAS[::4], "euler").x0
    sde = sample_ode(velocity, noise, SIGMAS[::4], "flow_sde", step_noise=lambda i: sde_noise(range(4), i, (2, 3, 3)),
                     noise_level=1e-7).x0
    torch.testing.assert_close(sde, euler, atol=1e-5, rtol=0)


def test_step_noise_is_a_function_of_the_seed_and_step_alone() -> None:
    both = sde_noise([11, 12], 3, (2, 4))
    assert torch.equal(both[1], sde_noise([12], 3, (2, 4))[0])  # batch composition does not matter
    assert not torch.equal(both[0], sde_noise([11], 4, (2, 4))[0])  # another step, other noise
    first_noise = torch.randn(2, 4, generator=torch.Generator().manual_seed(11))
    assert not torch.equal(sde_noise([11], 0, (2, 4))[0], first_noise)  # not the seed's initial noise


def test_flow_sde_needs_its_step_noise() -> None:
    with pytest.raises(ValueError, match="flow_sde solver needs step_noise"):
        sample_ode(gaussian_data_velocity(1.0), torch.zeros(1, 1), SIGMAS, "flow_sde")


def test_the_transition_log_prob_is_the_gaussian_density_averaged_over_elements() -> None:
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    sigma, sigma_next = torch.tensor([1.0, 0.6, 0.3]).view(-1, 1, 1, 1), torch.tensor([0.8, 0.4, 0.0]).view(-1, 1, 1, 1)
    mean, scale = flow_sde_transition(x, v, sigma, sigma_next, 0.7, sigma_max=0.8)
    # σ = 1 takes σ_max in the denominator: std = 0.7·sqrt(1 / (1 − 0.8))
    assert float(scale[0].flatten()[0]) == pytest.approx(0.7 * math.sqrt(1 / 0.2) * math.sqrt(0.2), rel=1e-6)
    x_next = mean + scale * torch.randn(x.shape, generator=g)
    expected = torch.distributions.Normal(mean, scale.expand_as(mean)).log_prob(x_next).mean(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_log_prob(x_next, mean, scale), expected)


def test_at_ratio_one_the_gradient_is_the_policy_gradient() -> None:
    """At θ = θ_old the loss's gradient is −mean(A·∇log π) (the clip does not bind), plus the KL's."""
    g = torch.Generator().manual_seed(3)
    mean = torch.randn(4, 1, 2, 2, generator=g).requires_grad_()
    scale, std = torch.full((4, 1, 1, 1), 0.3), torch.full((4,), 0.5)
    x_next = mean.detach() + 0.3 * torch.randn(mean.shape, generator=g)
    advantages = torch.tensor([2.0, -1.0, 7.0, 0.0])  # 7 is clipped to 5
    log_prob = gaussian_log_prob(x_next, mean, scale)
    loss, diag = flow_grpo_loss(log_prob, log_prob.detach(), advantages, mean, mean.detach(), std, kl_weight=0.04)
    (grad,) = torch.autograd.grad(loss, mean)
    reference = mean.detach().clone().requires_grad_()
    surrogate = -(advantages.clamp(-5, 5) * gaussian_log_prob(x_next, reference, scale)).mean()
    (expected,) = torch.autograd.grad(surrogate, reference)
    torch.testing.assert_close(grad, expected)
    assert float(diag["clip_fraction"]) == 0.0 and float(diag["approx_kl"]) == 0.0


def test_the_clip_stops_a_ratio_past_its_band_and_the_kl_pulls_to_the_reference() -> None:
    log_prob = torch.tensor([0.01, 0.01], requires_grad=True)  # ratio e^0.01 > 1 + 1e-4
    mean, ref = torch.zeros(2, 1, 2, 2, requires_grad=True), torch.ones(2, 1, 2, 2)
    loss, diag = flow_grpo_loss(log_prob, torch.zeros(2), torch.tensor([1.0, -1.0]), mean, ref, torch.ones(2),
                                kl_weight=0.5)
    log_grad, mean_grad = torch.autograd.grad(loss, (log_prob, mean))
    # A > 0 and ratio above 1 + ε: clipped, no gradient; A < 0: the unclipped term is the larger one
    assert float(log_grad[0]) == 0.0 and float(log_grad[1]) == pytest.approx(math.exp(0.01) / 2)
    assert float(diag["clip_fraction"]) == 1.0
    # KL = mean((μ_θ − μ_ref)²)/(2·std²): gradient (μ_θ − μ_ref)/(std²·elements) per sample, halved by the batch mean
    torch.testing.assert_close(mean_grad, torch.full_like(mean, -0.5 * 1 / 4 / 2))


def test_flow_grpo_needs_decay_zero(capsys) -> None:
    from cluster.config.loading import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"learner.objective \(flow_grpo\) needs learner.decay.type = 0"):
        load_config("configs/embedded.yaml", ["learner.objective=flow_grpo"])


def test_a_flow_grpo_iteration_trains_on_sde_rollouts(small_trainer) -> None:
    trainer = small_trainer("learner.algorithm=diffusionnft", "learner.objective=flow_grpo", "learner.decay.type=0",
                            "learner.timestep_fraction=0.9")
    assert trainer.rollouts.regen_sampling.solver == "flow_sde" and trainer.eval_sampling.solver == "euler"
    before = {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()}
    metrics = trainer.train_iteration(0).metrics()
    assert not metrics.get("skipped") and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.state.theta_parameters().items())
    # 2 prompts × 4 samples × ⌊0.9·4⌋ = 3 steps, each θ forward + backward (3) and the reference (1)
    assert metrics["train_passes"] == 2 * 4 * 3 * 4
