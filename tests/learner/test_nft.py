"""Selection, advantages, the DiffusionNFT loss and the sampling-policy decay schedules."""

from __future__ import annotations

import pytest
import torch

from learner.advantages import compute_advantages
from learner.config import DecayConfig
from learner.objectives import nft_loss, nft_optimality, trained_timestep_indices
from learner.schedules import linear_decay, nft_decay
from learner.selection import select_candidates

# ---- selection ---------------------------------------------------------------------------------


def test_best_worst_keeps_the_extremes_in_order():
    proxy = torch.tensor([0.5, 3.0, -1.0, 2.0, 0.0, -2.0, 1.0, 2.0])
    chosen = select_candidates(proxy, 4, "best_worst")
    assert chosen.tolist() == [1, 3, 5, 2]  # top 2 (ties by index: 3 before 7), then bottom 2 ascending


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        (3, [1, 5, 2]),  # 1 best, 2 worst
        (5, [1, 3, 5, 2, 4]),  # 2 best, 3 worst: the extra seed goes to the worst group, as the official code
        (7, [1, 3, 7, 5, 2, 4, 0]),  # 3 best, 4 worst
    ],
)
def test_best_worst_gives_an_odd_keeps_extra_seed_to_the_worst_group(k, expected):
    proxy = torch.tensor([0.5, 3.0, -1.0, 2.0, 0.0, -2.0, 1.0, 2.0])
    assert select_candidates(proxy, k, "best_worst").tolist() == expected


def test_mean_deviation_and_random_modes():
    proxy = torch.tensor([0.0, 10.0, 0.1, -9.0, 0.2, 5.0])
    assert set(select_candidates(proxy, 3, "mean_deviation").tolist()) == {1, 3, 5}
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = select_candidates(proxy, 4, "random", g1), select_candidates(proxy, 4, "random", g2)
    assert torch.equal(a, b) and len(set(a.tolist())) == 4
    extremes = select_candidates(proxy, 4, "extremes_random", torch.Generator().manual_seed(0))
    assert extremes[:2].tolist() == [1, 3] and len(set(extremes.tolist())) == 4


def test_selection_refuses_bad_requests():
    proxy = torch.zeros(5)
    with pytest.raises(ValueError, match="cannot keep k=6 of n=5"):
        select_candidates(proxy, 6)
    with pytest.raises(ValueError, match="unknown selection mode 'top'"):
        select_candidates(proxy, 2, "top")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass a seeded generator"):
        select_candidates(proxy, 2, "random")


# ---- advantages --------------------------------------------------------------------------------


def test_advantages_centre_per_prompt_and_scale_globally():
    rewards = torch.tensor([[1.0, 3.0], [10.0, 14.0]])
    std = rewards.std(unbiased=False)
    expected = torch.tensor([[-1.0, 1.0], [-2.0, 2.0]]) / (std + 1e-4)
    torch.testing.assert_close(compute_advantages(rewards), expected)
    assert compute_advantages(rewards, "binary").tolist() == [[-1.0, 1.0], [-1.0, 1.0]]
    assert compute_advantages(rewards, "one_only").tolist() == [[0.0, 1.0], [0.0, 1.0]]
    assert (compute_advantages(rewards, "positive_only") >= 0).all()
    assert (compute_advantages(rewards, "negative_only") <= 0).all()
    assert compute_advantages(torch.full((2, 3), 4.0)).abs().max() == 0


# ---- NFT loss ----------------------------------------------------------------------------------


def _batch(seed: int = 0, b: int = 6):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(b, 1, 4, 4, generator=g)
    eps = torch.randn(b, 1, 4, 4, generator=g)
    t = torch.rand(b, generator=g) * 0.9 + 0.05
    x_t = (1 - t.view(-1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1) * eps
    v_old = eps - x0 + 0.3 * torch.randn(b, 1, 4, 4, generator=g)
    v_ref = v_old + 0.1 * torch.randn(b, 1, 4, 4, generator=g)
    return x0, eps, t, x_t, v_old, v_ref


def test_nft_loss_equals_a_direct_per_sample_computation():
    x0, _, t, x_t, v_old, v_ref = _batch()
    v_theta = v_old + 0.2 * torch.randn_like(v_old)
    adv = torch.tensor([-7.0, -1.0, 0.0, 0.5, 2.0, 9.0])
    beta, c, kl = 0.7, 5.0, 1e-3
    total = 0.0
    for i in range(6):
        a = min(max(adv[i].item(), -c), c)
        r = min(max(a / c / 2 + 0.5, 0.0), 1.0)
        vp = beta * v_theta[i] + (1 - beta) * v_old[i]
        vn = (1 + beta) * v_old[i] - beta * v_theta[i]
        ep, en = x_t[i] - t[i] * vp - x0[i], x_t[i] - t[i] * vn - x0[i]
        lp = (ep.double() ** 2).mean() / max(ep.double().abs().mean().item(), 1e-5)
        ln = (en.double() ** 2).mean() / max(en.double().abs().mean().item(), 1e-5)
        total += (r * lp + (1 - r) * ln) / beta * c
    expected = total / 6 + kl * ((v_theta - v_ref).double() ** 2).mean()
    got = nft_loss(v_theta, v_old, v_ref, x_t, x0, t, adv, beta=beta, adv_clip_max=c, kl_weight=kl)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-8)


def test_optimality_probability():
    r = nft_optimality(torch.tensor([-100.0, -5.0, 0.0, 2.5, 5.0, 100.0]))
    assert r.tolist() == [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_gradient_vanishes_at_r_half_and_points_along_the_advantage(beta):
    x0, eps, t, x_t, v_old, _ = _batch(1)
    v_true = eps - x0

    def grad(adv_value: float) -> torch.Tensor:
        v_theta = v_old.clone().requires_grad_(True)
        adv = torch.full((x0.shape[0],), adv_value)
        nft_loss(v_theta, v_old, v_old, x_t, x0, t, adv, beta=beta, kl_weight=0.0).backward()
        return v_theta.grad

    assert grad(0.0).abs().max() < 1e-7  # r = ½ at v_θ = v_old: no update
    for adv_value, sign in ((3.0, 1.0), (-3.0, -1.0)):
        step = -grad(adv_value)  # gradient descent direction
        alignment = (step * (v_true - v_old)).flatten(1).sum(1)
        assert bool((sign * alignment > 0).all()), (adv_value, alignment)


def test_kl_term_pulls_towards_the_reference():
    x0, _, t, x_t, v_old, v_ref = _batch(2)
    v_theta = v_old.clone().requires_grad_(True)
    nft_loss(v_theta, v_old, v_ref, x_t, x0, t, torch.zeros(x0.shape[0]), kl_weight=1.0).backward()
    torch.testing.assert_close(v_theta.grad, 2 * (v_old - v_ref) / v_old.numel())


def test_trained_timesteps_are_a_per_sample_shuffle():
    idx = trained_timestep_indices(5, 10, 0.6, torch.Generator().manual_seed(0))
    assert idx.shape == (5, 6)
    assert all(len(set(row.tolist())) == 6 and max(row.tolist()) < 10 for row in idx)
    assert not all(torch.equal(idx[0], row) for row in idx[1:])
    assert torch.equal(idx, trained_timestep_indices(5, 10, 0.6, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="trains 0 timesteps"):
        trained_timestep_indices(1, 10, 0.05, torch.Generator())


# ---- decay schedules ---------------------------------------------------------------------------


def test_decay_schedules():
    assert [DecayConfig(type=0).decay(s) for s in (0, 10, 10_000)] == [0.0, 0.0, 0.0]
    assert [DecayConfig(type=1).decay(s) for s in (0, 100, 10_000)] == [0.0, 0.1, 0.5]
    assert [DecayConfig(type=2).decay(s) for s in (0, 75, 76, 10_000)] == [0.0, 0.0, 0.0075, 0.999]
    assert nft_decay(200, 0, 0.001, 0.5) == pytest.approx(0.2)
    assert [linear_decay(s, 0.1, 0.9, 4) for s in (0, 2, 4, 8)] == pytest.approx([0.1, 0.5, 0.9, 0.9])
    assert DecayConfig(type="linear", start=0.0, end=0.8, ramp_steps=8).decay(4) == pytest.approx(0.4)
