"""The selection-statistics bench: nested pools, the K-in-K baseline, order statistics, the advantages."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from tiny import tiny_config, tiny_sets

from bench.selection_stats import batch_advantages, kept_gap, main, normal_order_gap
from diffusion.loading import load_policy_from_config
from diffusion.noise import candidate_seeds
from diffusion.prompts import load_prompt_set
from learner.rollouts import generate, regeneration_sampling
from rewards import build_reward_from_config

POOLS = (4, 8, 12)  # K = 4 at the tiny scale; 3 prompts over 2 iterations of 2 slots: a full and a partial batch
SETS = ["reward.weights={digit_margin: 1.0}"]


def set_args(*extra: str) -> list[str]:
    return [arg for item in tiny_sets(*extra) for arg in ("--set", item)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path, threads = tmp_path_factory.mktemp("selection_stats") / "stats.json", torch.get_num_threads()
    try:
        main(["--prompts", "3", "--pools", ",".join(map(str, POOLS)), "--threads", "1", "--json", str(path),
              *set_args(*SETS)])
    finally:
        torch.set_num_threads(threads)  # the rest of the session keeps conftest's threads
    return json.loads(path.read_text())


def test_the_json_holds_every_table_for_every_pool(run):
    out = run
    assert {"gap", "selection", "advantages", "sigma", "normal_order_gap", "per_prompt", "seconds"} <= out.keys()
    assert out["keep"] == 4 and out["pools"] == list(POOLS) and len(out["per_prompt"]) == 3
    assert [(r["iteration"], r["slot"]) for r in out["per_prompt"]] == [(0, 0), (0, 1), (1, 0)]
    for ranking in ("low_precision", "full_precision"):
        for n in map(str, POOLS):
            assert {"gap", "ratio", "best_half", "worst_half", "kept_std", "gaussian_gap",
                    "gaussian_ratio"} <= out["gap"][ranking][n].keys()
            assert {"q05", "q25", "q50", "q75", "q95", "mean_abs", "mean_abs_ratio", "near_half", "clipped",
                    "batch_std"} <= out["advantages"][ranking][n].keys()
    for n in map(str, POOLS[1:]):
        s = out["selection"][n]
        assert 0.0 <= s["precision"] <= 1.0 and 0.0 <= s["best_below_median"] <= 1.0


def test_candidate_seeds_are_prefixes_so_the_pools_are_nested():
    for slot in (0, 5):
        largest = candidate_seeds(0, 3, slot, 96)
        for n in (24, 48, 72):
            assert candidate_seeds(0, 3, slot, n) == largest[:n]


def test_at_n_equals_k_the_whole_pool_is_kept_and_its_gap_is_the_pools(run):
    out = run
    keep = out["keep"]
    gaps = []
    for row in out["per_prompt"]:
        for ranking in ("low_precision", "full_precision"):
            assert sorted(row["kept"][str(keep)][ranking]) == list(range(keep))
        best, worst = kept_gap(np.asarray(row["truth"][:keep]), keep)
        gaps.append(best - worst)
    for ranking in ("low_precision", "full_precision"):
        assert out["gap"][ranking][str(keep)]["gap"] == pytest.approx(np.mean(gaps), abs=1e-9)
        assert out["gap"][ranking][str(keep)]["ratio"] == pytest.approx(1.0)


def test_the_full_precision_rankings_gap_never_shrinks_as_the_pool_grows(run):
    out = run
    for row in out["per_prompt"]:
        truth = np.asarray(row["truth"])
        gaps = [np.subtract(*kept_gap(truth[row["kept"][str(n)]["full_precision"]], out["keep"])) for n in POOLS]
        assert all(a <= b + 1e-9 for a, b in itertools.pairwise(gaps)), gaps
        for n in POOLS[1:]:  # each kept set is distinct seeds of its own pool
            for ranking in ("low_precision", "full_precision"):
                kept = row["kept"][str(n)][ranking]
                assert len(set(kept)) == out["keep"] and all(0 <= i < n for i in kept)


def test_advantages_of_mode_all_are_centred_per_prompt_and_scaled_per_iteration(run):
    out = run
    config = tiny_config(*SETS)
    for n in POOLS:
        for ranking in ("low_precision", "full_precision"):
            advantages, stds = batch_advantages(config, out["per_prompt"], n, ranking)
            assert advantages.shape == (3, out["keep"]) and len(stds) == 2  # iterations 0 and 1
            assert torch.allclose(advantages.sum(dim=1), torch.zeros(3), atol=1e-4)
            # the first iteration's two prompts share one scale: their A·std recovers the centred rewards
            row = out["per_prompt"][0]
            rewards = np.asarray(row["truth"])[row["kept"][str(n)][ranking]]
            assert np.allclose(advantages[0].numpy() * (stds[0] + 1e-4), rewards - rewards.mean(), atol=1e-3)


def test_a_kept_seeds_truth_is_what_the_learner_regenerates(run):
    """The truth comes from one pass over the largest pool; the learner samples only the kept seeds."""
    out = run
    config = tiny_config(*SETS)
    policy, reward = load_policy_from_config(config.model), build_reward_from_config(config.reward)
    row = out["per_prompt"][1]
    kept = row["kept"][str(POOLS[-1])]["low_precision"]
    meta = load_prompt_set(config.prompts.source).metadata_of(row["prompt"])
    again = generate(policy, None, reward, row["prompt"], [row["seeds"][i] for i in kept],
                     regeneration_sampling(config), metadata=meta).rewards
    assert np.allclose(again.numpy(), np.asarray(row["truth"])[kept], atol=1e-3)


def test_the_gaussian_prediction_is_the_order_statistics_expectation():
    assert normal_order_gap(2, 2) == pytest.approx(2 / np.sqrt(np.pi), abs=1e-9)  # E[max of 2] = 1/sqrt(π)
    assert normal_order_gap(24, 24) < normal_order_gap(48, 24) < normal_order_gap(96, 24)
    draws = torch.randn(20000, 48, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for n, keep in ((24, 24), (48, 24), (9, 5)):
        ordered = draws[:, :n].sort(dim=1, descending=True).values
        top, bottom = ordered[:, : keep // 2].mean(1), ordered[:, n - (keep - keep // 2):].mean(1)
        assert normal_order_gap(n, keep) == pytest.approx(float((top - bottom).mean()), abs=0.02)


def test_the_smallest_pool_must_be_k(tmp_path):
    with pytest.raises(SystemExit):  # refused before anything is loaded or the thread count is set
        main(["--pools", "8,12", "--json", str(tmp_path / "x.json"), *set_args()])
