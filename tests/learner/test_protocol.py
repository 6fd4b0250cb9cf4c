"""The papers' training protocol in the trainer: decay after the increment, decay type 3, the explore
solver, CFG on every sampling path, the EMA evaluation, non-finite micro-batches, renamed keys."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from cluster.config.loading import ConfigError, load_config
from learner.advantages import ADVANTAGE_MODES, AdvantageMode
from learner.algorithms import ALGORITHMS, Algorithm
from learner.config import DecayConfig
from learner.ema import ParameterEMA, ema_decay
from learner.objectives import Objective
from learner.rollouts import Sampling, exploration_sampling, generate
from learner.selection import SELECTION_MODES, SelectionMode
from learner.updates import OBJECTIVES

PROMPT = "a handwritten digit three"



def copy(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in params.items()}


def test_every_registry_covers_its_config_literal_exactly():
    assert set(ALGORITHMS) == set(get_args(Algorithm))
    assert set(OBJECTIVES) == set(get_args(Objective))
    assert set(SELECTION_MODES) == set(get_args(SelectionMode))
    assert set(ADVANTAGE_MODES) == set(get_args(AdvantageMode))


def test_the_first_soft_update_uses_the_decay_of_step_one(small_trainer):
    """Official: return_decay(global_step) after global_step += 1, so type 1 gives d = 0.001 at once
    (before: d(0) = 0, θ_old became θ exactly)."""
    trainer = small_trainer("learner.decay.type=1", "learner.algorithm=diffusionnft")
    old_before = copy(trainer.state.old_parameters())
    trainer.train_iteration(0)
    theta, old = trainer.state.theta_parameters(), trainer.state.old_parameters()
    # B starts at 0: where it moved, θ_old = 0.999·B differs from B in every moved entry
    moved = [k for k in theta if ".lora_B." in k and not torch.equal(theta[k], old_before[k])]
    assert moved, "θ must move"
    for k in moved:
        expected = old_before[k] * 0.001 + theta[k].detach() * (1 - 0.001)
        torch.testing.assert_close(old[k].detach(), expected, rtol=0, atol=1e-7)
        assert not torch.equal(old[k], theta[k])


def test_decay_type_3_is_a_ramp_to_the_custom_value():
    decay = DecayConfig(type=3, custom_steps=100, custom_value=0.8)
    assert [decay.decay(s) for s in (0, 50, 100, 1000)] == pytest.approx([0.0, 0.4, 0.8, 0.8])
    with pytest.raises(ValueError, match="custom_steps > 0 and custom_value > 0"):
        DecayConfig(type=3)


def test_exploration_uses_the_samplers_solver_unless_set():
    assert load_config("configs/embedded.yaml", ["sampler.solver=dpm2"]).explore.solver == "dpm2"
    config = load_config("configs/embedded.yaml", ["sampler.solver=dpm2", "explore.solver=euler"])
    assert exploration_sampling(config) == Sampling(6, "euler", 1.0)


def test_cfg_scale_reaches_every_sampling_path(small_trainer):
    """Before: sampler.cfg_scale was validated and then never passed to a sampler."""
    plain, guided = small_trainer(), small_trainer("sampler.cfg_scale=3.0")
    r = guided.rollouts
    assert r.regen_sampling.cfg_scale == r.explore_sampling.cfg_scale == guided.eval_sampling.cfg_scale == 3
    assert plain.evaluate() != guided.evaluate()
    a, b = (t.rollouts.ranked(0, 0, PROMPT, t.version) for t in (plain, guided))
    assert not torch.equal(a.proxy, b.proxy)
    # the guided path is the pipelines' CFG against the empty prompt
    seeds = [1, 2]
    out = generate(guided.policy, None, None, PROMPT, seeds, guided.rollouts.regen_sampling)
    direct = guided.policy.sample([PROMPT] * 2, seeds, steps=4, cfg_scale=3.0).x0
    assert torch.equal(out.x0, direct)


def test_ema_follows_the_official_warm_up_and_is_what_evaluation_sees(small_trainer):
    params = {"w": torch.zeros(3)}
    ema = ParameterEMA(params, decay=0.9)
    params["w"] += 1.0
    ema.update(params, step=1)  # d_1 = min(2/11, 0.9)
    assert torch.allclose(ema.average["w"], torch.full((3,), 1 - 2 / 11))
    assert ema_decay(1000, 0.9) == 0.9

    with_ema, without = small_trainer("learner.algorithm=diffusionnft"), small_trainer(
        "learner.algorithm=diffusionnft", "training.ema=false")
    theta0 = copy(with_ema.state.theta_parameters())
    for trainer in (with_ema, without):
        trainer.train_iteration(0)
    theta1 = with_ema.state.theta_parameters()
    weight = 1 - ema_decay(1, 0.9)
    for k, average in with_ema.state.ema.average.items():
        torch.testing.assert_close(average, theta0[k] + weight * (theta1[k].detach() - theta0[k]), rtol=0, atol=1e-7)
    assert with_ema.evaluate() != without.evaluate()
    kept = copy(theta1)
    with with_ema.state.evaluated():
        assert any(not torch.equal(theta1[k], kept[k]) for k in kept)
    assert all(torch.equal(theta1[k], kept[k]) for k in kept), "θ must come back bit for bit"


def test_a_non_finite_micro_batch_is_dropped_not_the_update(small_trainer):
    """Before: one NaN loss made the whole update skip. Now that micro-batch is dropped (the intent of the
    official loop's multiplying a non-finite loss by 0, which keeps it NaN there) and the rest still trains."""
    trainer = small_trainer("learner.algorithm=diffusionnft", "learner.micro_batch=4")
    groups = [trainer.rollout(0, slot, p) for slot, p in enumerate(trainer.prompts_for(0))]
    x0 = groups[1].samples.x0.clone()
    x0[0] = float("nan")  # every micro-batch holding sample 4 (slot 1's first) has a NaN loss
    groups[1].samples.x0 = x0
    rewards = trainer.updater.rewards_for_update(0, groups)
    before = copy(trainer.state.theta_parameters())
    advantages = trainer.updater.objective.advantages(rewards, trainer.config.learner)
    metrics, _ = trainer.updater.update(0, groups, advantages)
    trained_timesteps = int(0.6 * 4)  # ⌊timestep_fraction · steps⌋
    assert metrics["dropped_micro_batches"] == trained_timesteps
    after = trainer.state.theta_parameters()
    assert trainer.state.skipped_steps == 0
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(bool(torch.isfinite(v).all()) for v in after.values())


def test_renamed_keys_name_the_new_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^learner.family was renamed learner.algorithm; write "
                                          r"learner.algorithm: naive_quant$"):
        load_config("configs/embedded.yaml", ["learner.family=naive_quant"])
    preset = tmp_path / "old.yaml"
    preset.write_text("learner:\n  family: sol_rl\n")
    with pytest.raises(ConfigError, match=rf"^{preset} line 2: learner.family was renamed learner.algorithm"):
        load_config(preset)
