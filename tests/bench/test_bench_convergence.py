"""The convergence benchmark's bookkeeping: crossing times, the cost model, speedups, merging result files."""

from __future__ import annotations

import json
import math

import pytest

from bench.convergence import PRICES, add_modeled_cost, first_reach, main, merge, speedup_profile, speedups
from bench.plan import paper_costs


def curve(rewards: list[float], every: int = 4, cost: float = 1.0) -> list[dict]:
    return [{"iteration": i * every, "wall_s": i * every * cost, "modeled_s": i * every * cost * 2, "eval_reward": r}
            for i, r in enumerate(rewards)]


def raw_curve(rewards: list[float], fp: int, lp: int, train_s: float = 1.0, pool: int = 0,
              passes: int = 5760) -> list[dict]:
    """Points with cumulative raw counters, as run_one records them (per-iteration amounts given)."""
    return [{"iteration": i, "wall_s": i * train_s, "rollout_s": 0.0, "train_s": i * train_s,
             "fp_sample_steps": i * fp, "fp_pool_sample_steps": i * pool, "lp_sample_steps": i * lp,
             "train_passes": i * passes, "eval_reward": r} for i, r in enumerate(rewards)]


def test_first_reach_interpolates_between_evaluations() -> None:
    points = curve([-2.0, -1.0, 0.0])
    assert first_reach(points, -0.5, "iteration") == pytest.approx(6.0)  # halfway between 4 and 8
    assert first_reach(points, -1.0, "modeled_s") == pytest.approx(8.0)  # exactly at the evaluation
    assert first_reach(points, -3.0, "iteration") == 0.0  # already there at the start
    assert first_reach(points, 0.5, "iteration") == math.inf


def test_first_reach_uses_the_first_crossing_not_the_last() -> None:
    points = curve([-2.0, -0.4, -0.8, -0.2])  # crosses −0.5 between 0 and 4, dips, crosses again
    assert first_reach(points, -0.5, "iteration") == pytest.approx(4 * 1.5 / 1.6)


def test_modeled_time_prices_counted_work_at_the_papers_table_5_rates() -> None:
    sd35 = paper_costs("sd35_large")
    # One Sol-RL iteration of the paper (48 prompts, 96 × 6 NVFP4 steps, 24 × 10 regenerated, 24 × 6
    # trained timesteps × 5 passes) costs Table 5's 125 + 62 + 240 s on 8 GPUs.
    paper = {"iteration": 1, "fp_sample_steps": 48 * 24 * 10, "fp_pool_sample_steps": 0,
             "lp_sample_steps": 48 * 96 * 6, "train_passes": 48 * 24 * 6 * 5, "eval_reward": 0.0}
    naive = {**paper, "fp_sample_steps": 0, "fp_pool_sample_steps": 48 * 96 * 10, "lp_sample_steps": 0}
    runs = {"sol_rl": {0: [paper]}, "naive_scaling": {0: [naive]}}
    add_modeled_cost(runs)
    assert paper["modeled_s"] == pytest.approx((125 + 62 + 240) * 8)
    assert naive["modeled_s"] == pytest.approx((451 + 240) * 8)  # Table 5's naive 691 s
    assert PRICES["lp_sample_steps"] / PRICES["fp_pool_sample_steps"] == pytest.approx(0.462, abs=1e-3)
    assert PRICES["fp_sample_steps"] == sd35.regen_s_per_sample_step


def test_modeled_time_does_not_depend_on_the_machine() -> None:
    fast = {"diffusionnft": {0: raw_curve([-2.0, -1.0], fp=100, lp=0, train_s=1.0)}}
    slow = {"diffusionnft": {0: raw_curve([-2.0, -1.0], fp=100, lp=0, train_s=50.0)}}
    add_modeled_cost(fast), add_modeled_cost(slow)
    assert fast["diffusionnft"][0][1]["modeled_s"] == slow["diffusionnft"][0][1]["modeled_s"] > 0


def test_speedups_against_the_baselines_own_final_reward() -> None:
    runs = {"diffusionnft": {0: curve([-2.0, -1.5, -1.0, -0.5])},  # reaches its final −0.5 at 12
            "sol_rl": {0: curve([-2.0, -1.0, 0.0, 0.5], cost=1.5)},  # reaches −0.5 at 6 iterations
            "never": {0: curve([-2.0, -1.9, -1.8, -1.7])}}
    summary = speedups(runs)
    assert summary["diffusionnft"]["iteration"]["mean"] == pytest.approx(1.0)
    assert summary["sol_rl"]["iteration"]["per_seed"] == [pytest.approx(2.0)]
    assert summary["sol_rl"]["wall_s"]["per_seed"] == [pytest.approx(12 / 9)]  # 6 iterations at 1.5 s
    assert summary["never"]["modeled_s"]["per_seed"] == [0.0]
    halfway = speedups(runs, fraction=0.5)  # target: diffusionnft's −1.0 at iteration 8 (first at or past 6)
    assert halfway["sol_rl"]["iteration"]["per_seed"] == [pytest.approx(8 / 4)]
    assert speedup_profile(runs)["sol_rl"]["1.0"]["iteration"]["mean"] == pytest.approx(2.0)


def test_merge_combines_runs_and_refuses_bad_input(tmp_path) -> None:
    def result(path, seed, names):
        runs = {name: {str(seed): raw_curve([-2.0, -1.0 - 0.1 * seed], fp=100, lp=0)} for name in names}
        path.write_text(json.dumps({"args": {}, "runs": runs}))
        return path

    a = result(tmp_path / "a.json", 0, ["diffusionnft", "sol_rl"])
    b = result(tmp_path / "b.json", 1, ["diffusionnft"])
    c = result(tmp_path / "c.json", 1, ["sol_rl"])  # one run per file, as the evidence suite writes them
    merge([a, b, c], tmp_path / "merged.json", None)
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert sorted(merged["runs"]["sol_rl"]) == ["0", "1"]
    assert merged["summary"]["vs_diffusionnft"]["sol_rl"]["final_eval_reward"] == [-1.0, -1.1]
    with pytest.raises(SystemExit, match="already in an earlier file"):
        merge([a, a], tmp_path / "twice.json", None)
    with pytest.raises(SystemExit, match="diffusionnft sets each seed's target"):
        merge([a, result(tmp_path / "d.json", 2, ["sol_rl"])], tmp_path / "bad.json", None)


def test_an_unknown_run_name_is_refused_before_any_work(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--runs", "diffusionnft,sol_rl_explore3", "--json", "unused.json"])
    assert "unknown run(s) sol_rl_explore3: choose from" in capsys.readouterr().err


def test_every_named_run_is_a_valid_config_that_sets_what_its_name_says() -> None:
    from bench.convergence import RUNS
    from bench.evidence import COMMON, PLAN
    from cluster.config.loading import load_config

    configs = {name: load_config("configs/embedded.yaml", COMMON + settings) for name, settings in RUNS.items()}
    assert {name for name, _ in PLAN} <= set(RUNS)
    assert all(c.reward.weights == {"digit_margin": 1.0} for c in configs.values())
    assert [configs[f"sol_rl_explore{s}"].explore.steps for s in (2, 4, 8)] == [2, 4, 8]
    assert [configs[f"sol_rl_pool{n}"].prompts.candidates for n in (24, 48, 72)] == [24, 48, 72]
    assert configs["sol_rl"].prompts.candidates == 96 and configs["sol_rl"].explore.steps == 6
    assert (configs["sol_rl_halving"].explore.halving_steps, configs["sol_rl_halving3"].explore.halving_steps) == (2, 3)
    assert configs["flow_grpo"].learner.objective == "flow_grpo" and configs["sol_rl_art"].learner.objective == "art"
    assert configs["sol_rl_shuffled"].learner.shuffle_rewards and not configs["sol_rl"].learner.shuffle_rewards
