"""The learner's rank-fidelity monitor: Spearman ρ over groups that have one, the selection precision over all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.fidelity import rank_fidelity


def test_rank_fidelity_of_known_groups():
    true = torch.tensor([0.0, 1.0, 2.0, 3.0])
    same = (true * 2, true)  # the same order: ρ 1, every seed on the right side of the median
    reversed_ = (-true, true)  # ρ −1, every seed on the wrong side
    swapped = (torch.tensor([1.0, 0.0, 2.0, 3.0]), true)  # one swap below the median: ρ 0.8, sides kept
    flat = (torch.zeros(4), true)  # a constant proxy has no ρ; all on the low side: half right
    metrics = rank_fidelity([same, reversed_, swapped, flat])
    assert metrics["rank_spearman"] == pytest.approx((1.0 - 1.0 + 0.8) / 3)
    assert metrics["selection_precision"] == pytest.approx((1.0 + 0.0 + 1.0 + 0.5) / 4)
    assert rank_fidelity([(t.numpy(), r.numpy()) for t, r in (same, swapped)]) == rank_fidelity([same, swapped])


def test_rank_fidelity_without_a_rho_or_without_groups():
    metrics = rank_fidelity([(torch.zeros(3), torch.arange(3.0))])
    assert math.isnan(metrics["rank_spearman"]) and metrics["selection_precision"] == pytest.approx(2 / 3)
    assert rank_fidelity([]) == {}
    assert isinstance(rank_fidelity([(np.arange(3.0), np.arange(3.0))])["rank_spearman"], float)


def test_spearman_is_scipys_on_ties_and_constants():
    from scipy.stats import spearmanr

    from learner.fidelity import spearman

    rng = np.random.default_rng(0)
    for n in (2, 3, 8, 33):
        for _ in range(20):
            proxy, reference = rng.integers(0, 4, n).astype(np.float32), rng.normal(size=n)  # ties in the proxy
            expected = spearmanr(proxy, reference).statistic
            got = spearman(proxy, reference)
            assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-12)
    assert math.isnan(spearman(np.ones(5), np.arange(5.0)))
