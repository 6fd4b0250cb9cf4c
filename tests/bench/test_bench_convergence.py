"""The convergence benchmark's bookkeeping: crossing times, the cost model, speedups, merging result files."""

from __future__ import annotations

import json
import math

import pytest

from bench.convergence import add_modeled_time, first_reach, merge, speedup_profile, speedups


def curve(rewards: list[float], every: int = 4, cost: float = 1.0) -> list[dict]:
    return [{"iteration": i * every, "wall_s": i * every * cost, "modeled_s": i * every * cost * 2, "eval_reward": r}
            for i, r in enumerate(rewards)]


def raw_curve(rewards: list[float], fp: int, lp: int, rollout_s: float, train_s: float) -> list[dict]:
    """Points with cumulative raw counters, as run_one records them (per-iteration amounts given)."""
    return [{"iteration": i, "wall_s": i * (rollout_s + train_s), "rollout_s": i * rollout_s, "train_s": i * train_s,
             "fp_sample_steps": i * fp, "lp_sample_steps": i * lp, "eval_reward": r} for i, r in enumerate(rewards)]


def test_first_reach_interpolates_between_evaluations() -> None:
    points = curve([-2.0, -1.0, 0.0])
    assert first_reach(points, -0.5, "iteration") == pytest.approx(6.0)  # halfway between 4 and 8
    assert first_reach(points, -1.0, "modeled_s") == pytest.approx(8.0)  # exactly at the evaluation
    assert first_reach(points, -3.0, "iteration") == 0.0  # already there at the start
    assert first_reach(points, 0.5, "iteration") == math.inf


def test_first_reach_uses_the_first_crossing_not_the_last() -> None:
    points = curve([-2.0, -0.4, -0.8, -0.2])  # crosses −0.5 between 0 and 4, dips, crosses again
    assert first_reach(points, -0.5, "iteration") == pytest.approx(4 * 1.5 / 1.6)


def test_modeled_time_charges_low_precision_steps_at_046_of_the_measured_full_precision_step() -> None:
    runs = {"diffusionnft": {0: raw_curve([-2.0, -1.0], fp=100, lp=0, rollout_s=0.5, train_s=2.0)},  # c = 5 ms
            "sol_rl": {0: raw_curve([-2.0, -0.5], fp=100, lp=400, rollout_s=9.0, train_s=2.0)}}
    assert add_modeled_time(runs) == {0: pytest.approx(0.005)}
    assert runs["diffusionnft"][0][1]["modeled_s"] == pytest.approx(0.5 + 2.0)
    # the CPU's own (slow) low-precision rollout time is replaced by the model: 0.005·(100 + 0.46·400) + 2
    assert runs["sol_rl"][0][1]["modeled_s"] == pytest.approx(0.005 * (100 + 0.46 * 400) + 2.0)
    assert runs["sol_rl"][0][0]["modeled_s"] == 0.0


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


def test_merge_combines_seeds_costs_each_with_its_own_c_and_refuses_bad_input(tmp_path) -> None:
    def result(path, seed, families):
        runs = {name: {str(seed): raw_curve([-2.0, -1.0 - 0.1 * seed], fp=100, lp=0, rollout_s=0.1 * (seed + 1),
                                            train_s=1.0)} for name in families}
        path.write_text(json.dumps({"args": {}, "runs": runs}))
        return path

    a = result(tmp_path / "a.json", 0, ["diffusionnft", "sol_rl"])
    b = result(tmp_path / "b.json", 1, ["diffusionnft", "sol_rl"])
    merge([a, b], tmp_path / "merged.json", None)
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert sorted(merged["runs"]["sol_rl"]) == ["0", "1"]
    assert merged["step_cost_s"] == {"0": pytest.approx(0.001), "1": pytest.approx(0.002)}
    assert merged["summary"]["vs_diffusionnft"]["sol_rl"]["final_eval_reward"] == [-1.0, -1.1]
    with pytest.raises(SystemExit, match="already in an earlier file"):
        merge([a, a], tmp_path / "twice.json", None)
    with pytest.raises(SystemExit, match="diffusionnft sets each seed's target"):
        merge([a, result(tmp_path / "c.json", 2, ["sol_rl"])], tmp_path / "bad.json", None)
