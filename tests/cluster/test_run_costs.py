"""A run's measured costs: the formulas on hand-made metrics, in the capacity model's format."""

from __future__ import annotations

import json

import pytest

from bench.plan import load_costs
from cluster.config.loading import load_config
from cluster.reports.run_costs import measured_costs


def test_costs_follow_their_formulas_over_the_iterations_after_the_first(tmp_path):
    config = load_config("configs/embedded.yaml", ["prompts.per_iteration=2", "prompts.candidates=8",
                                                   "prompts.keep=4", "explore.steps=3"])
    first = {"explore_busy_s": 100.0, "rollout_s": 100.0, "train_s": 100.0, "fp_sample_steps": 1, "sync_s": 9.0}
    history = [first,
               {"explore_busy_s": 4.8, "rollout_s": 1.0, "streamed_rollout_s": 2.0, "train_s": 8.0,
                "fp_sample_steps": 40, "sync_s": 0.1},
               {"explore_busy_s": 5.6, "rollout_s": 3.0, "train_s": 8.0, "fp_sample_steps": 40, "sync_s": 0.3}]
    costs = measured_costs(config, history)
    # 2 iterations × 2 prompts × 8 candidates × 3 steps = 96 explored sample-steps
    assert costs == pytest.approx({"explore_s_per_sample_step": 10.4 / 96, "regen_s_per_sample_step": 6.0 / 80,
                                   "train_s_per_sample": 16.0 / 16, "sync_s": 0.2})
    (tmp_path / "costs.json").write_text(json.dumps(costs))
    assert load_costs(tmp_path / "costs.json").train_s_per_sample == pytest.approx(1.0)
    assert measured_costs(config, [first]) == pytest.approx({"explore_s_per_sample_step": 100.0 / 48,
                                                             "regen_s_per_sample_step": 100.0,
                                                             "train_s_per_sample": 100.0 / 8, "sync_s": 9.0})
    assert measured_costs(config, [{"train_s": 1.0}]) is None  # a single-process run has no explorers
