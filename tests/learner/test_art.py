"""DiffusionART objective: guidance invariances, target direction, restoration, SDE KL, trust mask, windows."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from learner.art import (
    TRUST_MASKS,
    art_guidance,
    art_loss,
    art_target,
    pairwise_scores,
    sde_kl,
    split_windows,
    trust_mask,
)

INF = float("inf")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _states(b: int = 6, shape: tuple[int, ...] = (2, 3, 3), seed: int = 0):
    g = _gen(seed)
    t = torch.rand(b, generator=g) * 0.8 + 0.1
    dt = -(torch.rand(b, generator=g) * 0.05 + 0.02)
    v_old = torch.randn(b, *shape, generator=g)
    return t, dt, v_old, g


# ---------------------------------------------------------------- guidance


def test_equal_rewards_give_exactly_zero_guidance():
    x0 = torch.randn(5, 4, 3, generator=_gen())
    g = art_guidance(x0, torch.full((5,), 0.37))
    assert g.shape == (4, 3) and torch.equal(g, torch.zeros(4, 3))


def test_guidance_invariant_to_affine_rewards_and_permutation():
    gen = _gen(1)
    x0, r = torch.randn(8, 2, 5, 5, generator=gen), torch.randn(8, generator=gen)
    g = art_guidance(x0, r)
    assert g.abs().max() > 1e-3
    torch.testing.assert_close(art_guidance(x0, 3 * r + 7), g, atol=1e-6, rtol=1e-6)
    perm = torch.randperm(8, generator=gen)
    torch.testing.assert_close(art_guidance(x0[perm], r[perm]), g, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(art_guidance(x0, -2 * r + 1), -g, atol=1e-6, rtol=1e-6)


def test_guidance_is_the_covariance_over_std_normalised_to_unit_rms():
    """The source: the aggregated direction is normalised so no strength coefficient is needed."""
    gen = _gen(2)
    x0, r = torch.randn(6, 7, dtype=torch.float64, generator=gen), torch.randn(6, dtype=torch.float64, generator=gen)
    cov = ((r - r.mean())[:, None] * (x0 - x0.mean(0))).mean(0) / r.std(unbiased=False)
    g = art_guidance(x0, r)
    torch.testing.assert_close(g, cov / cov.pow(2).mean().sqrt())
    assert g.pow(2).mean().sqrt().item() == pytest.approx(1.0, abs=1e-12)
    # the same step however much the samples differ: 100× the spread, the same G
    torch.testing.assert_close(art_guidance(100 * x0, r), g)
    same = x0[:1].expand(6, 7).clone()  # identical samples: no direction, not 0/0
    assert torch.equal(art_guidance(same, r), torch.zeros(7, dtype=torch.float64))


def test_pairwise_scores_values():
    r = torch.tensor([[0.2, 0.9], [3.0, -1.0], [0.5, 0.5]])
    assert torch.equal(pairwise_scores(r), torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]))
    assert pairwise_scores(torch.tensor([2, 1])).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError):
        pairwise_scores(torch.ones(3))


def test_pairwise_guidance_is_the_normalised_difference_and_tie_is_zero():
    gen = _gen(3)
    x0 = torch.randn(2, 3, 8, 8, generator=gen, dtype=torch.float64)
    for rewards, (w, lo) in ((torch.tensor([0.1, 0.8]), (1, 0)), (torch.tensor([5.0, -2.0]), (0, 1))):
        g = art_guidance(x0, pairwise_scores(rewards))
        diff = x0[w] - x0[lo]
        torch.testing.assert_close(g, diff / diff.pow(2).mean().sqrt(), rtol=1e-12, atol=1e-12)
    tie = art_guidance(x0, pairwise_scores(torch.tensor([0.4, 0.4])))
    assert torch.equal(tie, torch.zeros_like(tie))


# ---------------------------------------------------------------- target


def test_target_moves_data_prediction_along_guidance_with_no_strength_to_tune():
    t, _, v_start, gen = _states()
    x_t = torch.randn_like(v_start)
    guidance = torch.randn(v_start.shape[1:], generator=gen)
    tt = t.view(-1, 1, 1, 1)
    for scale, factor in ((None, 1.0), (0.5, 0.5)):  # None: the source; a number: the labelled extension
        v_star = art_target(v_start, guidance, scale=scale)
        shift = (x_t - tt * v_star) - (x_t - tt * v_start)
        assert bool(((shift * guidance).flatten(1).sum(1) > 0).all())
        torch.testing.assert_close(shift, tt * factor * guidance.expand_as(shift))
    assert not art_target(v_start.requires_grad_(), guidance).requires_grad


# ---------------------------------------------------------------- restoration


def _grads(v_theta, v_target, v_old, t, dt, restore_weight):
    leaf = v_theta.detach().clone().requires_grad_(True)
    loss, _ = art_loss(leaf, v_target, v_old, t, dt, restore_weight=restore_weight, threshold=INF,
                       reading="trust_region")  # no state past δ: no reading masks
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad


def test_window_one_gradient_is_pure_regression():
    t, dt, v_old, gen = _states(seed=4)
    v_theta = v_old + 0.3 * torch.randn(v_old.shape, generator=gen)
    v_target = v_old - torch.randn(v_old.shape[1:], generator=gen)
    n = v_theta.numel()  # B·D
    grad = _grads(v_theta, v_target, v_old, t, dt, restore_weight=0.0)
    leaf = v_theta.clone().requires_grad_(True)
    (regression,) = torch.autograd.grad((leaf - v_target).pow(2).flatten(1).mean(1).mean(), leaf)
    assert torch.equal(grad, regression)  # bit for bit: the restoration contributes nothing in window 1
    torch.testing.assert_close(grad, 2 * (v_theta - v_target) / n)


def test_window_two_replaying_the_frozen_target_restores_in_proportion_to_drift_and_its_optimum_is_the_target():
    """Default (no explicit restoration): window 2's gradient 2(v_θ − v*)/n = 2(drift + G)/n has a part
    proportional to the drift window 1 caused, and vanishes exactly at the frozen target."""
    t, dt, v_old, gen = _states(seed=5)
    guidance = torch.randn(v_old.shape[1:], generator=gen)
    v_target = art_target(v_old, guidance)
    drift = 0.2 * torch.randn(v_old.shape, generator=gen)
    n = v_old.numel()
    g0, g1, g2 = (_grads(v_old + s * drift, v_target, v_old, t, dt, 0.0) for s in (0.0, 1.0, 2.0))
    torch.testing.assert_close(g1 - g0, 2 * drift / n)  # the restoring part, ∝ drift
    torch.testing.assert_close(g2 - g0, 2 * (g1 - g0))
    torch.testing.assert_close(g0, 2 * guidance.expand_as(g0) / n)  # no drift: the guidance alone
    at_target = _grads(v_target, v_target, v_old, t, dt, 0.0)
    assert torch.equal(at_target, torch.zeros_like(at_target))  # the optimum of window 2 is v*
    # gradient descent on window 2's loss alone ends at the frozen target
    v = (v_old + drift).clone().requires_grad_(True)
    optim = torch.optim.SGD([v], lr=n / 4)
    for _ in range(50):
        loss, _ = art_loss(v, v_target, v_old, t, dt, threshold=INF, reading="trust_region")
        optim.zero_grad()
        loss.backward()
        optim.step()
    torch.testing.assert_close(v.detach(), v_target, atol=1e-6, rtol=0)


def test_the_explicit_restoration_extension_adds_a_force_proportional_to_drift():
    t, dt, v_old, gen = _states(seed=5)
    v_target = v_old - torch.randn(v_old.shape[1:], generator=gen)
    drift = 0.2 * torch.randn(v_old.shape, generator=gen)
    lam, n = 0.7, v_old.numel()
    restoring = []
    for scale in (1.0, 2.0):
        v_theta = v_old + scale * drift
        extra = _grads(v_theta, v_target, v_old, t, dt, lam) - _grads(v_theta, v_target, v_old, t, dt, 0.0)
        torch.testing.assert_close(extra, 2 * lam * (v_theta - v_old) / n)
        restoring.append(extra)
    torch.testing.assert_close(restoring[1], 2 * restoring[0])
    # no drift, no restoring force
    extra = _grads(v_old, v_target, v_old, t, dt, lam) - _grads(v_old, v_target, v_old, t, dt, 0.0)
    assert torch.equal(extra, torch.zeros_like(extra))


# ---------------------------------------------------------------- KL and trust mask


def test_kl_is_zero_and_nothing_masked_without_drift():
    t, dt, v_old, gen = _states(seed=6)
    v_target = v_old - torch.randn(v_old.shape, generator=gen)
    assert torch.equal(sde_kl(v_old, v_old.clone(), t, dt), torch.zeros(len(t)))
    for reading in TRUST_MASKS:
        assert torch.equal(trust_mask(v_old, v_old.clone(), v_target, t, dt, reading=reading), torch.ones(len(t)))
        _, diag = art_loss(v_old, v_target, v_old.clone(), t, dt, restore_weight=1.0, reading=reading)
        assert diag["masked_fraction"].item() == 0.0 and diag["restore_loss"].item() == 0.0


def test_kl_matches_gaussian_kl_of_the_sde_transitions():
    gen = _gen(7)
    b, a = 5, 0.7
    t = torch.rand(b, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    dt = -(torch.rand(b, generator=gen, dtype=torch.float64) * 0.1 + 0.01)
    x = torch.randn(b, 4, 6, generator=gen, dtype=torch.float64)
    v_theta, v_old = (torch.randn(b, 4, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    tt, h = t.view(-1, 1, 1), dt.abs().view(-1, 1, 1)
    std = a * torch.sqrt(tt / (1 - tt))

    def mean(v):  # Flow-GRPO SDE step from t to t − h
        return x - (v + std**2 / (2 * tt) * (x + (1 - tt) * v)) * h

    scale = (std * h.sqrt()).expand_as(x)
    direct = kl_divergence(Normal(mean(v_theta), scale), Normal(mean(v_old), scale)).flatten(1).mean(1)
    torch.testing.assert_close(sde_kl(v_theta, v_old, t, dt, noise_level=a), direct)
    torch.testing.assert_close(sde_kl(v_theta, v_old, t, -dt, noise_level=a), direct)  # sign of dt is irrelevant


def test_kl_is_finite_at_the_ends_of_the_grid():
    v_theta, v_old = torch.ones(3, 4), torch.zeros(3, 4)
    kl = sde_kl(v_theta, v_old, torch.tensor([0.0, 1.0, 0.5]), torch.tensor([-0.1, -0.1, 0.0]))
    assert bool(torch.isfinite(kl).all()) and kl[2] == 0.0


def test_trust_mask_blocks_only_states_that_drifted_away_from_their_target_outside_the_region():
    """The source: past the threshold, an update that goes away from the target is blocked; those that go
    towards it are kept."""
    b, d = 4, 8
    t, dt = torch.full((b,), 0.5), torch.full((b,), -0.1)
    v_old = torch.zeros(b, d)
    drift = torch.ones(b, d)
    v_theta = v_old + torch.tensor([1.0, 1.0, 1e-3, 1e-3]).view(-1, 1) * drift
    # targets, seen from the old policy: against the drift, along it, against it, along it
    v_target = v_old + torch.tensor([-1.0, 2.0, -1.0, 2.0]).view(-1, 1) * drift
    kl = sde_kl(v_theta, v_old, t, dt)
    assert bool((kl[:2] > 1e-5).all()) and bool((kl[2:] < 1e-5).all())  # two outside, two inside
    mask = trust_mask(v_theta, v_old, v_target, t, dt, threshold=1e-5, reading="away_from_target")
    assert mask.tolist() == [0.0, 1.0, 1.0, 1.0] and not mask.requires_grad
    # the blocked state contributes no gradient, the others do
    leaf = v_theta.clone().requires_grad_(True)
    loss, diag = art_loss(leaf, v_target, v_old, t, dt, restore_weight=0.0, reading="away_from_target")
    (grad,) = torch.autograd.grad(loss, leaf)
    assert torch.equal(grad[0], torch.zeros(d)) and bool((grad[1:] != 0).all())
    assert diag["masked_fraction"].item() == pytest.approx(0.25)


def test_the_two_readings_of_the_mask_block_opposite_states():
    """Past δ, away_from_target blocks a state whose drift points away from its target (whose regression would
    pull it back); trust_region blocks the step that would carry a state further from θ_old (a target beyond
    it along its drift) and keeps the corrective ones. A state that overshot its target is kept by both, and
    nothing inside the region is masked by either."""
    b, d = 4, 8
    t, dt, v_old, unit = torch.full((b,), 0.5), torch.full((b,), -0.1), torch.zeros(b, d), torch.ones(b, d)
    v_theta = v_old + torch.tensor([1.0, 1.0, 1.0, 1e-3]).view(-1, 1) * unit  # three past δ, one inside
    # targets along the drift's line: behind θ_old, beyond θ (further out), short of θ (overshot), beyond
    v_target = v_old + torch.tensor([-1.0, 2.0, 0.5, 2.0]).view(-1, 1) * unit
    away = trust_mask(v_theta, v_old, v_target, t, dt, reading="away_from_target")
    region = trust_mask(v_theta, v_old, v_target, t, dt, reading="trust_region")
    assert away.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert region.tolist() == [1.0, 0.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="unknown trust mask 'both'"):
        trust_mask(v_theta, v_old, v_target, t, dt, reading="both")


@pytest.mark.parametrize("reading", ["away_from_target", "trust_region"])
def test_only_the_trust_region_reading_bounds_the_drift(reading):
    """Regressing one state onto a target far from θ_old: the trust-region reading stops once the state's KL
    passes δ (every further step would move it out), so the drift ends within one step of δ; the other reading
    never blocks a state drifting towards its target and goes all the way."""
    t, dt, v_old = torch.full((1,), 0.5), torch.full((1,), -0.1), torch.zeros(1, 8)
    v_target = v_old + 1.0
    v = v_old.clone().requires_grad_(True)
    optim = torch.optim.SGD([v], lr=0.05)
    for _ in range(2000):  # each step covers 2·0.05/8 = 1/80 of the remaining gap
        loss, _ = art_loss(v, v_target, v_old, t, dt, threshold=1e-5, reading=reading)
        optim.zero_grad()
        loss.backward()
        optim.step()
    final = float(sde_kl(v.detach(), v_old, t, dt))
    if reading == "trust_region":  # the first step (drift 1/80, KL 2.5e-5) crossed δ; every later one was blocked
        assert final == pytest.approx(float(sde_kl(v_old + 1 / 80, v_old, t, dt)), rel=1e-4) and final > 1e-5
    else:
        assert float((v.detach() - v_target).abs().max()) < 1e-4 and final > 1000 * 1e-5  # at its target


def test_an_art_iteration_masks_by_the_trust_region_by_default_and_logs_the_batch_mask_and_drift(small_trainer):
    trainer = small_trainer("learner.algorithm=diffusionnft", "learner.objective=art", "learner.decay.type=0",
                            "learner.micro_batch=5")
    # the default reading: the one the evidence runs measured bounding drift and holding accuracy
    assert trainer.config.learner.art.trust_mask == "trust_region"
    losses = trainer.train_iteration(0).losses
    assert losses["window1_masked_fraction"] == 0.0 and losses["window1_restore"] == 0.0  # no drift in window 1
    # over all 2 prompts × 2 samples × ⌊0.6·4⌋ = 2 states per window, in micro-batches of 5: a share of 8 states
    assert losses["window2_masked_fraction"] * 8 == round(losses["window2_masked_fraction"] * 8)
    assert losses["window2_restore"] > 0 and losses["window2_guidance"] == pytest.approx(1.0, rel=1e-5)
    ratio = losses["window2_restore"] / losses["window2_guidance"]
    assert losses["window2_restore_to_guidance"] == pytest.approx(ratio)
    assert losses["drift_kl"] > 0


# ---------------------------------------------------------------- windows


def test_split_windows_are_disjoint_even_and_seeded():
    for k in (1, 2, 7, 8):
        a, b = split_windows(k, _gen(11))
        assert len(a) == (k + 1) // 2 and len(b) == k // 2
        assert sorted(torch.cat([a, b]).tolist()) == list(range(k))
        a2, b2 = split_windows(k, _gen(11))
        assert torch.equal(a, a2) and torch.equal(b, b2)
    splits = {tuple(split_windows(8, _gen(s))[0].tolist()) for s in range(10)}
    assert len(splits) > 1


# ---------------------------------------------------------------- end to end


def test_linear_policy_learns_towards_target():
    """Window 1 regresses onto the frozen target; window 2 replays it on the other states, on from where
    window 1 left the shared parameters."""
    torch.manual_seed(0)
    gen = _gen(12)
    d, k, steps_per_state = 6, 8, 4
    policy = torch.nn.Linear(d, d)
    start = copy.deepcopy(policy).requires_grad_(False)  # v_start = v_old: the sampling policy
    # one prompt: K final samples and rewards give the guidance; states visited by its rollouts
    x0 = 0.05 * torch.randn(k, d, generator=gen)
    guidance = art_guidance(x0, torch.randn(k, generator=gen))
    x_t = torch.randn(k, steps_per_state, d, generator=gen)
    t = torch.rand(k, steps_per_state, generator=gen) * 0.8 + 0.1
    dt = torch.full((k, steps_per_state), -0.1)
    windows = split_windows(k, gen)

    def error_and_drift() -> tuple[float, float]:
        with torch.no_grad():
            x = x_t.reshape(-1, d)
            v, v_old = policy(x), start(x)
            return (v - art_target(v_old, guidance)).pow(2).mean().item(), (v - v_old).pow(2).mean().item()

    before, _ = error_and_drift()
    optim = torch.optim.Adam(policy.parameters(), lr=1e-2)
    after, masked = [], []
    for idx in windows:
        x = x_t[idx].reshape(-1, d)
        tw, dtw = t[idx].reshape(-1), dt[idx].reshape(-1)
        v_old = start(x)
        v_target = art_target(v_old, guidance)
        for _ in range(60):
            loss, diag = art_loss(policy(x), v_target, v_old, tw, dtw, reading="away_from_target")
            optim.zero_grad()
            loss.backward()
            optim.step()
            assert torch.isfinite(loss)
            masked.append(diag["masked_fraction"].item())
        after.append(error_and_drift())
    (error_1, drift_1), (error_2, drift_2) = after
    # measured: 1.0 → 0.53 → 0.12 (rms(G) = 1 makes the start exactly 1), drift 0.58 → 0.83, masked ≤ 19%
    assert before == pytest.approx(1.0) and error_1 < 0.6 * before
    assert error_2 < 0.5 * error_1  # window 2 goes on towards the same frozen target from where window 1 left it
    assert drift_2 > drift_1 > 0
    # some states drifted away from their target past δ and were masked; most went on learning
    assert 0 < max(masked) < 0.5
