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


# Flow-GRPO as its source runs it: the first 0.99 of the steps and the EMA every 8 are its defaults
GRPO = ("learner.algorithm=diffusionnft", "learner.objective=flow_grpo", "learner.decay.type=0")


def test_a_flow_grpo_iteration_trains_on_sde_rollouts(small_trainer) -> None:
    trainer = small_trainer(*GRPO, "learner.timestep_fraction=0.9")
    assert trainer.rollouts.regen_sampling.solver == "flow_sde" and trainer.eval_sampling.solver == "euler"
    before = {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()}
    metrics = trainer.train_iteration(0).metrics()
    assert not metrics.get("skipped") and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in trainer.state.theta_parameters().items())
    # 2 prompts × 4 samples × ⌊0.9·4⌋ = 3 steps, each θ forward + backward (3) and the reference (1)
    assert metrics["train_passes"] == 2 * 4 * 3 * 4


# ---- Flow-GRPO as its authors run it (yifan123/flow_grpo `scripts/train_sd3.py`, `config/grpo.py`) -------------


def _context(trainer, **learner_updates):
    from learner.updates import UpdateContext

    learner = trainer.config.learner
    if learner_updates:
        learner = learner.model_copy(update={"grpo": learner.grpo.model_copy(update=learner_updates)})
    return UpdateContext(trainer.policy, trainer.state, learner, trainer.updater.sigmas, 0, 0, slots=[0, 1],
                         batch_slots=2)


def test_the_rollout_stores_the_samplers_log_prob_of_every_step(small_trainer) -> None:
    """log π_old is recorded while sampling, one per step taken, and is the density of the step the sampler took
    under the transition the policy defines at that state (what the PPO ratio divides by)."""
    trainer = small_trainer(*GRPO)
    group = trainer.rollout(0, 0, trainer.prompts_for(0)[0])
    samples, sigmas = group.samples, trainer.updater.sigmas
    assert samples.log_probs.shape == (4, len(sigmas) - 1)
    cond = trainer.policy.encode([group.prompt] * 4)
    for i in range(len(sigmas) - 1):
        with trainer.state.use("old") as model:
            v = trainer.policy.velocity(samples.states[i], sigmas[i].expand(4), cond, transformer=model)
        mean, scale = flow_sde_transition(samples.states[i], v, sigmas[i], sigmas[i + 1], 0.7, float(sigmas[1]))
        torch.testing.assert_close(samples.log_probs[:, i], gaussian_log_prob(samples.states[i + 1], mean, scale))


def test_two_optimizer_steps_make_the_ratio_move_and_the_clip_bind(small_trainer) -> None:
    """The first step is taken at θ = θ_old (ratio 1 up to rounding, nothing clipped); the second at the θ the
    first left, against the stored log π_old: ratios ≠ 1 and |ratio − 1| > ε clips."""
    trainer = small_trainer(*GRPO)
    losses = trainer.train_iteration(0).losses
    assert losses["step1_ratio_mean"] == pytest.approx(1.0, abs=1e-6) and losses["step1_clip_fraction"] == 0.0
    assert losses["step2_ratio_mean"] != 1.0 and losses["step2_clip_fraction"] > 0.0
    assert losses["step2_approx_kl"] > 0.0 and math.isfinite(losses["step2_grad_norm"])
    assert "step3_loss" not in losses and trainer.state.optimizer_steps == 2


def test_the_trained_steps_are_the_first_ones_in_order_and_never_the_last(small_trainer) -> None:
    from learner.updates import trained_steps

    ctx = _context(small_trainer(*GRPO))
    assert torch.equal(trained_steps(ctx, 3, 10), torch.arange(9).expand(3, 9))  # 0.99 of 10: steps 0..8
    shuffled = trained_steps(_context(small_trainer(*GRPO), timesteps="shuffled"), 3, 10)
    assert shuffled.shape == (3, 9) and not torch.equal(shuffled, torch.arange(9).expand(3, 9))


def test_zero_advantage_samples_are_dropped_and_the_rest_shared_between_the_steps(small_trainer) -> None:
    from learner.updates import optimizer_batches

    ctx = _context(small_trainer(*GRPO))
    advantages = torch.tensor([[0.5, 0.0, -0.5, 0.0], [1.0, -1.0, 0.0, 2.0]])
    shares = optimizer_batches(ctx, advantages)
    assert [len(s) for s in shares] == [3, 2]
    assert sorted(torch.cat(shares).tolist()) == [0, 2, 4, 5, 7]  # the rows whose advantage is not 0
    assert all(torch.equal(a, b) for a, b in zip(shares, optimizer_batches(ctx, advantages), strict=True))
    kept_all = optimizer_batches(_context(small_trainer(*GRPO), drop_zero_advantage=False), advantages)
    assert sorted(torch.cat(kept_all).tolist()) == list(range(8))


def test_a_prompt_with_equal_rewards_trains_nothing(small_trainer) -> None:
    trainer = small_trainer(*GRPO)
    groups = [trainer.rollout(0, slot, p) for slot, p in enumerate(trainer.prompts_for(0))]
    groups[0].samples.rewards = torch.full_like(groups[0].samples.rewards, 3.0)  # advantage 0 for all four
    advantages = trainer.updater.objective.advantages(trainer.updater.rewards_for_update(0, groups),
                                                      trainer.config.learner)
    metrics, passes = trainer.updater.update(0, groups, advantages)
    assert metrics["trained_samples"] == 4 and passes == 4 * 3 * 4  # slot 1's four: 3 steps, θ (3) + reference (1)


def test_cfg_is_applied_in_the_training_forward_as_in_the_rollout(small_trainer) -> None:
    """With guidance, the update's log π at θ = θ_old is the rollout's own (ratio 1 at the first step), which
    only holds when the training forward guides as the sampler did; each guided forward counts twice."""
    trainer = small_trainer(*GRPO, "sampler.cfg_scale=3.0")
    ctx, group = _context(trainer), trainer.rollout(0, 0, trainer.prompts_for(0)[0])
    x, sigma = group.samples.states[1], ctx.sigmas[1].expand(4)
    with trainer.state.use("old") as model:
        guided = ctx.velocity(model, x, sigma, [group.prompt] * 4, cfg_scale=3.0)
        plain = ctx.velocity(model, x, sigma, [group.prompt] * 4)
    assert float((guided - plain).abs().mean()) > 0.01 and ctx.passes == 4 * 2 + 4
    losses = trainer.train_iteration(0).losses
    assert losses["step1_ratio_mean"] == pytest.approx(1.0, abs=1e-6) and losses["step1_clip_fraction"] == 0.0


def test_under_cfg_the_gradient_flows_through_the_conditional_branch_only(small_trainer) -> None:
    """The source's compute_log_prob detaches v_u: ∇(v_u + s·(v_c − v_u)) = s·∇v_c (`grpo.cfg_gradient`
    "conditional"); "both" keeps (1 − s)·∇v_u + s·∇v_c. Checked on θ's gradient of a fixed linear read-out."""
    trainer = small_trainer(*GRPO, "sampler.cfg_scale=3.0")
    ctx, group = _context(trainer), trainer.rollout(0, 0, trainer.prompts_for(0)[0])
    x, sigma, prompts = group.samples.states[1], ctx.sigmas[1].expand(4), [group.prompt] * 4
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    params = list(trainer.state.theta_parameters().values())

    def grads(**kwargs) -> list[torch.Tensor]:
        with trainer.state.use("theta") as model:
            return list(torch.autograd.grad((ctx.velocity(model, x, sigma, prompts, **kwargs) * weights).sum(),
                                            params, allow_unused=True, materialize_grads=True))

    uncond = trainer.policy.unconditional(4)
    with trainer.state.use("theta") as model:  # ∇v_u alone: the negative prompt's conditional forward
        v_u = trainer.policy.velocity(x, sigma, uncond, transformer=model)
        grad_u = torch.autograd.grad((v_u * weights).sum(), params, allow_unused=True, materialize_grads=True)
    grad_c = grads()
    conditional, both = grads(cfg_scale=3.0, detach_uncond=True), grads(cfg_scale=3.0)
    assert any(float(g.abs().max()) > 0 for g in grad_u)
    # tolerance: the guided forward batches [uncond, cond] in one call, the references run each half alone
    scale = max(float(g.abs().max()) for g in grad_c)
    for g_cond, g_both, g_c, g_u in zip(conditional, both, grad_c, grad_u, strict=True):
        torch.testing.assert_close(g_cond, 3.0 * g_c, rtol=1e-3, atol=1e-3 * scale)
        torch.testing.assert_close(g_both, 3.0 * g_c - 2.0 * g_u, rtol=1e-3, atol=1e-3 * scale)
    assert max(float((a - b).abs().max()) for a, b in zip(conditional, both, strict=True)) > 0.1 * scale


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_the_cfg_gradient_option_changes_the_update_only_under_guidance(small_trainer, cfg_scale) -> None:
    """The update takes the configured branch: under guidance the two options train different weights; at
    cfg_scale 1 (no unconditional branch) bitwise the same ones."""
    weights = {}
    for mode in ("conditional", "both"):
        trainer = small_trainer(*GRPO, f"sampler.cfg_scale={cfg_scale}", f"learner.grpo.cfg_gradient={mode}")
        trainer.train_iteration(0)
        weights[mode] = {k: v.detach().clone() for k, v in trainer.state.theta_parameters().items()}
    same = all(torch.equal(weights["conditional"][k], weights["both"][k]) for k in weights["both"])
    assert same == (cfg_scale == 1.0)


@pytest.mark.parametrize(("weights", "expected"), [
    ("{pickscore: 1.0}", 0.01), ("{clipscore: 1.0}", 0.02), ("{ocr: 1.0}", 0.04), ("{digit_margin: 1.0}", 0.04),
    ("{digit_margin: 1.0, jpeg_compressibility: 0.5}", 0.04)])
def test_the_kl_weight_is_the_sources_for_the_configured_reward(weights, expected) -> None:
    from cluster.config.loading import load_config

    config = load_config("configs/embedded.yaml", [*GRPO, f"reward.weights={weights}"])
    assert config.learner.grpo.kl_weight == expected
    assert load_config("configs/embedded.yaml", [*GRPO, "learner.grpo.kl_weight=0.5"]).learner.grpo.kl_weight == 0.5


def test_the_objectives_source_defaults_are_what_a_config_without_them_resolves_to() -> None:
    """The EMA interval and the trained share of the steps: flow_grpo 8 and 0.99 (yifan123/flow_grpo), nft and
    art 1 and 0.6 (Sol-RL); a value given explicitly is kept."""
    from typing import get_args

    from cluster.config.loading import load_config
    from learner.config import OBJECTIVE_DEFAULTS
    from learner.objectives import Objective

    assert sorted(OBJECTIVE_DEFAULTS) == sorted(get_args(Objective))
    grpo = load_config("configs/embedded.yaml", list(GRPO))
    assert (grpo.training.ema_every, grpo.learner.timestep_fraction) == (8, 0.99)
    nft = load_config("configs/embedded.yaml", [])
    assert (nft.training.ema_every, nft.learner.timestep_fraction) == (1, 0.6)
    art = load_config("configs/embedded.yaml", ["learner.objective=art", "learner.decay.type=0"])
    assert (art.training.ema_every, art.learner.timestep_fraction) == (1, 0.6)
    given = load_config("configs/embedded.yaml", [*GRPO, "training.ema_every=2", "learner.timestep_fraction=0.5"])
    assert (given.training.ema_every, given.learner.timestep_fraction) == (2, 0.5)


def test_the_ema_folds_every_nth_step() -> None:
    from learner.ema import ParameterEMA

    theta = {"w": torch.zeros(1)}
    ema, folded = ParameterEMA(theta, 0.9, every=8), []
    for step in range(1, 17):
        theta["w"] += 1.0
        before = ema.average["w"].clone()
        ema.update(theta, step)
        if not torch.equal(before, ema.average["w"]):
            folded.append(step)
    assert folded == [7, 15]  # (s + 1) mod 8 = 0, as the source's EMAModuleWrapper.step
