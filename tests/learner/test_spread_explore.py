"""Adaptive exploration by spread: every slot explores its first chunk of candidates, and the rest only
where the std of that chunk's proxies reaches the previous iteration's median; each seed takes every
explore step and is scored once, and a short pool is a prefix of the full one."""

from __future__ import annotations

import math

import pytest
import torch

from diffusion.noise import candidate_seeds
from learner.rollouts import (
    exploration_sampling,
    explore_group,
    first_chunk_spread,
    generate,
    spread_pool_size,
    spread_reference,
)

FIRST, N, K = 6, 8, 4  # the tiny scale's N and K (tests/tiny.py), a first chunk between them
SPREAD = ["explore.schedule=spread", f"explore.spread_first={FIRST}"]


def test_a_short_pool_is_the_prefix_of_the_full_one(small_trainer) -> None:
    trainer = small_trainer(*SPREAD)
    sampling, prompt, seed = exploration_sampling(trainer.config), trainer.prompt_set.texts[0], trainer.config.run.seed
    assert candidate_seeds(seed, 3, 1, FIRST) == candidate_seeds(seed, 3, 1, N)[:FIRST]

    def explored(reference: float | None):
        return explore_group(trainer.policy, None, trainer.reward, iteration=3, slot=1, prompt=prompt,
                             seeds=candidate_seeds(seed, 3, 1, N), sampling=sampling, policy_version=0,
                             spread_reference=reference)

    short, full, first_iteration = explored(math.inf), explored(0.0), explored(None)
    assert short.seeds == candidate_seeds(seed, 3, 1, FIRST) and full.seeds == candidate_seeds(seed, 3, 1, N)
    assert first_iteration.seeds == full.seeds and torch.equal(first_iteration.proxy, full.proxy)
    # the first chunk is sampled and scored alone: its proxies, and so its spread, do not depend on the decision
    assert torch.equal(full.proxy[:FIRST], short.proxy) and full.first_spread == short.first_spread
    assert short.first_spread == first_chunk_spread(short.proxy)
    tail = generate(trainer.policy, None, trainer.reward, prompt, full.seeds[FIRST:], sampling)
    assert torch.equal(full.proxy[FIRST:], tail.rewards)
    # every seed takes every explore step and is scored once
    steps = sampling.steps
    assert (short.sample_steps, full.sample_steps) == (FIRST * steps, N * steps)
    if hasattr(short, "scored"):
        assert (short.scored, full.scored) == (FIRST, N)


def test_the_rule_on_constructed_proxies() -> None:
    # the previous iteration's first chunks: stds 0.5, 1, 2, 4 (and a slot whose reward broke)
    previous = [torch.tensor([-s, 0.0, s]) for s in (0.5, 1.0, 2.0, 4.0)]  # unbiased std: exactly s
    spreads = [first_chunk_spread(p) for p in previous] + [first_chunk_spread(torch.tensor([0.0, math.nan]))]
    assert spreads[:4] == [0.5, 1.0, 2.0, 4.0] and math.isnan(spreads[4])
    reference = spread_reference(spreads)
    assert reference == 1.5  # the median of the finite ones
    wide, narrow = torch.tensor([0.0, 3.0, -3.0, 1.0]), torch.tensor([0.0, 0.1, -0.1, 0.2])
    assert spread_pool_size(first_chunk_spread(wide), reference, 48, 96, "median") == 96
    assert spread_pool_size(first_chunk_spread(narrow), reference, 48, 96, "median") == 48
    assert spread_pool_size(reference, reference, 48, 96, "median") == 96  # reaching the reference is enough
    assert spread_pool_size(first_chunk_spread(narrow), None, 48, 96, "median") == 96  # iteration 0: no reference
    assert spread_pool_size(math.nan, reference, 48, 96, "median") == 48  # a broken reward keeps the first chunk
    assert spread_reference([3.0, 1.0, 2.0]) == 2.0 and spread_reference([None, math.inf]) is None
    assert spread_reference([]) is None


@pytest.mark.parametrize(("spread", "size"), [
    (1.5, 72),  # at the reference: the mean pool, (48 + 96) / 2
    (1.75, 84), (1.25, 60),  # in proportion: 72 · σ / 1.5
    (3.0, 96), (0.5, 48),  # clamped to [first, N]
    (math.nan, 48), (math.inf, 96),
])
def test_the_proportional_rule_on_constructed_spreads(spread, size) -> None:
    assert spread_pool_size(spread, 1.5, 48, 96, "proportional") == size
    assert spread_pool_size(spread, None, 48, 96, "proportional") == 96  # iteration 0
    assert spread_pool_size(spread, 0.0, 48, 96, "proportional") == (48 if math.isnan(spread) else 96)


@pytest.mark.parametrize("rule", ["median", "proportional"])
def test_iteration_0_explores_all_then_the_previous_median_decides_and_the_work_is_the_pools(small_trainer,
                                                                                           rule) -> None:
    trainer = small_trainer(*SPREAD, "prompts.per_iteration=3", f"explore.spread_rule={rule}")
    steps = trainer.config.explore.steps
    first = trainer.train_iteration(0).metrics()
    assert first["lp_sample_steps"] == 3 * N * steps  # no previous iteration: every slot takes N
    ranked0 = [trainer.rollouts.ranked(0, s, p, 0) for s, p in enumerate(trainer.prompts_for(0))]
    assert trainer.spread_reference == spread_reference(g.first_spread for g in ranked0)
    assert trainer.spread_reference == sorted(g.first_spread for g in ranked0)[1]
    reference = trainer.spread_reference
    trainer.publish()
    trainer.finish_iteration()
    second = trainer.train_iteration(1).metrics()
    ranked1 = [trainer.rollouts.ranked(1, s, p, 1, reference) for s, p in enumerate(trainer.prompts_for(1))]
    sizes = [spread_pool_size(g.first_spread, reference, FIRST, N, rule) for g in ranked1]
    assert [len(g.seeds) for g in ranked1] == sizes
    if rule == "median":  # a mixed iteration: one slot at least below the reference, one above
        assert sizes == [N if g.first_spread >= reference else FIRST for g in ranked1]
        assert sorted(set(sizes)) == [FIRST, N], sizes
    assert second["lp_sample_steps"] == sum(sizes) * steps
    if "scored_images" in second:  # each seed scored once, then the K regenerated
        assert second["scored_images"] == sum(sizes) + 3 * K
    assert trainer.spread_reference == spread_reference(g.first_spread for g in ranked1)


@pytest.mark.parametrize(("sets", "message"), [
    (["explore.spread_first=96"], r"explore.spread_first \(96\) must be >= prompts.keep \(24\) and < "
                                  r"prompts.candidates \(96\)"),
    (["explore.spread_first=12"], r"explore.spread_first \(12\) must be >= prompts.keep \(24\)"),
    (["learner.algorithm=naive_quant"], r"explore.schedule \(spread\) needs learner.algorithm = sol_rl"),
])
def test_a_spread_schedule_that_cannot_work_is_refused(sets, message) -> None:
    from cluster.config.loading import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config("configs/embedded.yaml", ["explore.schedule=spread", *sets])
    assert load_config("configs/embedded.yaml", ["explore.schedule=spread"]).explore.spread_first == 48
