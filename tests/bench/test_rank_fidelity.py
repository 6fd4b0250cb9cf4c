"""Rank fidelity measured per reward: each component's ranking is the one a run on that reward alone gets."""

from __future__ import annotations

import pytest
from tiny import tiny_config

from bench.rank_fidelity import format_table, measure
from diffusion.loading import load_policy_from_config
from rewards import build_reward_from_config


def run(*overrides: str):
    config = tiny_config(*overrides)
    policy = load_policy_from_config(config.model)
    return measure(config, policy, build_reward_from_config(config.reward), 2, 13, 3, 4, ["nvfp4"])


def test_each_components_fidelity_equals_a_run_on_that_reward_alone():
    multi = run("reward.weights={digit_alignment: 1.0, jpeg_compressibility: 0.5}")
    digits = run("reward.weights={digit_alignment: 1.0}")
    jpeg = run("reward.weights={jpeg_compressibility: 1.0}")
    for variant in ("none_explore_steps", "nvfp4"):
        per_reward = multi[variant]["per_reward"]
        assert per_reward.keys() == {"digit_alignment", "jpeg_compressibility"}
        for name, alone in (("digit_alignment", digits), ("jpeg_compressibility", jpeg)):
            for key in ("spearman", "kendall", "hit@4", "hit@12", "bottom_hit@12"):
                assert per_reward[name][key] == pytest.approx(alone[variant][key], abs=1e-12), (variant, name, key)
        assert "per_reward" not in digits[variant]
    table = format_table(multi)
    assert "Spearman ρ per reward:" in table and "| digit_alignment | jpeg_compressibility |" in table


def test_a_variant_can_name_its_backend_the_real_fp8_engine_beside_the_fake_one():
    results = run("reward.weights={digit_alignment: 1.0}")
    config = tiny_config()
    policy = load_policy_from_config(config.model)
    both = measure(config, policy, build_reward_from_config(config.reward), 2, 13, 3, 4, ["fp8", "fp8:torchao"])
    assert {"none_explore_steps", "fp8", "fp8_torchao"} <= both.keys()
    assert both["none_explore_steps"]["spearman"] == results["none_explore_steps"]["spearman"]
    # The same E4M3 codes and scales (tests/diffusion/test_fp8_engine.py): the rankings agree closely.
    assert both["fp8_torchao"]["spearman"] == pytest.approx(both["fp8"]["spearman"], abs=0.05)
    assert "| fp8_torchao | 3 |" in format_table(both)
