"""DiffusionART objective: guidance invariances, target direction, restoration, SDE KL, trust mask, windows."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from learner.art import (
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


def test_guidance_is_covariance_over_std():
    gen = _gen(2)
    x0, r = torch.randn(6, 7, dtype=torch.float64, generator=gen), torch.randn(6, dtype=torch.float64, generator=gen)
    cov = ((r - r.mean())[:, None] * (x0 - x0.mean(0))).mean(0)
    g = art_guidance(x0, r)
    torch.testing.assert_close(g, cov / r.std(unbiased=False))
    # Cauchy–Schwarz: G_j = corr(R, x0_j)·std(x0_j), so it never exceeds the samples' own spread
    assert bool((g.abs() <= x0.std(0, unbiased=False) + 1e-12).all())


def test_pairwise_scores_values():
    r = torch.tensor([[0.2, 0.9], [3.0, -1.0], [0.5, 0.5]])
    assert torch.equal(pairwise_scores(r), torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]]))
    assert pairwise_scores(torch.tensor([2, 1])).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError):
        pairwise_scores(torch.ones(3))


def test_pairwise_guidance_is_half_the_difference_and_tie_is_zero():
    gen = _gen(3)
    x0 = torch.randn(2, 3, 8, 8, generator=gen)
    for rewards, (w, lo) in ((torch.tensor([0.1, 0.8]), (1, 0)), (torch.tensor([5.0, -2.0]), (0, 1))):
        g = art_guidance(x0, pairwise_scores(rewards))
        assert torch.equal(g, (x0[w] - x0[lo]) / 2)
    tie = art_guidance(x0, pairwise_scores(torch.tensor([0.4, 0.4])))
    assert torch.equal(tie, torch.zeros_like(tie))


# ---------------------------------------------------------------- target


def test_target_moves_data_prediction_along_guidance():
    t, _, v_start, gen = _states()
    x_t = torch.randn_like(v_start)
    guidance = torch.randn(v_start.shape[1:], generator=gen)
    v_star = art_target(v_start, guidance, scale=0.5)
    tt = t.view(-1, 1, 1, 1)
    shift = (x_t - tt * v_star) - (x_t - tt * v_start)
    inner = (shift * guidance).flatten(1).sum(1)
    assert bool((inner > 0).all())
    torch.testing.assert_close(shift, tt * 0.5 * guidance.expand_as(shift))
    assert not art_target(v_start.requires_grad_(), guidance).requires_grad


# ---------------------------------------------------------------- restoration


def _grads(v_theta, v_target, v_old, t, dt, restore_weight):
    leaf = v_theta.detach().clone().requires_grad_(True)
    loss, _ = art_loss(leaf, v_target, v_old, t, dt, restore_weight=restore_weight, threshold=INF)
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


def test_window_two_restoring_gradient_is_proportional_to_drift():
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
    assert torch.equal(trust_mask(v_old, v_old.clone(), v_target, t, dt), torch.ones(len(t)))
    _, diag = art_loss(v_old, v_target, v_old.clone(), t, dt, restore_weight=1.0)
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


def test_trust_mask_blocks_only_outward_steps_outside_the_region():
    b, d = 4, 8
    t, dt = torch.full((b,), 0.5), torch.full((b,), -0.1)
    v_old = torch.zeros(b, d)
    drift = torch.ones(b, d)
    v_theta = v_old + torch.tensor([1.0, 1.0, 1e-3, 1e-3]).view(-1, 1) * drift
    # targets: further out, back towards old, further out, back towards old
    v_target = v_theta + torch.tensor([1.0, -1.0, 1.0, -1.0]).view(-1, 1) * drift
    kl = sde_kl(v_theta, v_old, t, dt)
    assert bool((kl[:2] > 1e-5).all()) and bool((kl[2:] < 1e-5).all())  # two outside, two inside
    mask = trust_mask(v_theta, v_old, v_target, t, dt, threshold=1e-5)
    assert mask.tolist() == [0.0, 1.0, 1.0, 1.0] and not mask.requires_grad
    # the blocked sample contributes no regression gradient, the restoring one still does
    leaf = v_theta.clone().requires_grad_(True)
    loss, diag = art_loss(leaf, v_target, v_old, t, dt, restore_weight=0.0)
    (grad,) = torch.autograd.grad(loss, leaf)
    assert torch.equal(grad[0], torch.zeros(d)) and bool((grad[1:] != 0).all())
    assert diag["masked_fraction"].item() == pytest.approx(0.25)


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
    """Window 1 regresses onto the frozen target; window 2 keeps improving on it but pulls the drift back."""
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
    optim = torch.optim.Adam(policy.parameters(), lr=1e-3)
    after, masked = [], []
    for restore_weight, idx in zip((0.0, 1.0), windows, strict=True):
        x = x_t[idx].reshape(-1, d)
        tw, dtw = t[idx].reshape(-1), dt[idx].reshape(-1)
        v_old = start(x)
        v_target = art_target(v_old, guidance)
        for _ in range(30):
            loss, diag = art_loss(policy(x), v_target, v_old, tw, dtw, restore_weight=restore_weight)
            optim.zero_grad()
            loss.backward()
            optim.step()
            assert torch.isfinite(loss)
            masked.append(diag["masked_fraction"].item())
        after.append(error_and_drift())
    (error_1, drift_1), (error_2, drift_2) = after
    assert error_1 < 0.2 * before and error_2 < 0.5 * before  # both windows end well below the start
    assert drift_2 < drift_1 and error_2 > error_1  # the restoration pulls back towards the old policy
    assert max(masked) > 0  # the trust region engaged (δ = 1e-5) without stopping the learning
