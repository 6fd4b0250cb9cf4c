"""Adaptive exploration by successive halving: the pool stops early, its middle is dropped, the survivors
finish exactly as one pass would have finished them, and the work is counted as done."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from learner.rollouts import exploration_sampling, generate, score, successive_halving

HALVING = ["explore.schedule=halving", "explore.halving_steps=1", "explore.halving_survivors=4"]


@pytest.mark.parametrize("solver", ["euler", "flow_sde"])
def test_a_span_continues_exactly_where_it_stopped(small_trainer, solver) -> None:
    policy = small_trainer().policy
    prompts, seeds = ["7"] * 3, [5, 6, 7]
    kwargs = dict(steps=4, solver=solver)
    whole = policy.sample(prompts, seeds, **kwargs)
    head = policy.sample(prompts, seeds, span=(0, 2), **kwargs)
    tail = policy.sample(prompts, seeds, span=(2, 4), start=head.x0, **kwargs)
    assert torch.equal(tail.x0, whole.x0)  # the SDE's step noise continues from step 2, not from 0
    with pytest.raises(ValueError, match="start states exactly when a > 0"):
        policy.sample(prompts, seeds, span=(2, 4), **kwargs)


def test_survivors_are_the_ends_of_the_early_ranking_finished_as_one_pass_would(small_trainer) -> None:
    trainer = small_trainer(*HALVING)
    sampling, prompt, seeds = exploration_sampling(trainer.config), trainer.prompt_set.texts[0], list(range(100, 108))
    kept, proxy, _ = successive_halving(trainer.policy, None, trainer.reward, prompt, seeds, sampling)
    early = trainer.policy.sample([prompt] * 8, seeds, steps=sampling.steps, span=(0, 1))
    early_scores, _ = score(trainer.reward, trainer.policy.decode(early.x0_prediction), [prompt] * 8, None)
    order = torch.argsort(early_scores, descending=True).tolist()
    assert kept == [seeds[i] for i in sorted(order[:2] + order[-2:])]
    one_pass = generate(trainer.policy, None, trainer.reward, prompt, kept, replace(sampling, halving=None))
    assert torch.equal(proxy, one_pass.rewards)


def test_the_explore_cost_counts_the_cut(small_trainer) -> None:
    trainer = small_trainer(*HALVING)  # 2 prompts, N = 8, 3 explore steps; 1 step for all, 2 more for 4
    metrics = trainer.train_iteration(0).metrics()
    assert metrics["lp_sample_steps"] == 2 * (8 * 1 + 4 * 2)
    assert not metrics.get("skipped")


@pytest.mark.parametrize(("sets", "message"), [
    (["explore.halving_steps=6"], r"explore.halving_steps \(6\) must be < explore.steps \(6\)"),
    (["explore.halving_survivors=12"], r"explore.halving_survivors \(12\) must lie between prompts.keep \(24\)"),
    (["learner.algorithm=naive_quant"], r"explore.schedule \(halving\) needs learner.algorithm = sol_rl"),
])
def test_a_halving_schedule_that_cannot_work_is_refused(sets, message) -> None:
    from cluster.config.loading import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config("configs/embedded.yaml", ["explore.schedule=halving", *sets])
