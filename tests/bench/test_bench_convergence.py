"""The convergence benchmark's bookkeeping: crossing times, the cost model, speedups, merging result files."""

from __future__ import annotations

import json
import math

import pytest
from tiny import tiny_config

from bench.convergence import (
    PRICES,
    PRICES_HIGH_D,
    PRICES_LOW_D,
    add_modeled_cost,
    first_reach,
    main,
    merge,
    run_one,
    speedup_profile,
    speedups,
)
from bench.plan import paper_costs
from bench.prices import D_DEFAULT, D_HIGH, Costs, counter_prices


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
    # trained timesteps × 5 passes, 96 + 24 images decoded and scored per prompt) costs Table 5's
    # 125 + 62 + 240 s on 8 GPUs, at every decode + reward price d of the bracket.
    paper = {"iteration": 1, "fp_sample_steps": 48 * 24 * 10, "fp_pool_sample_steps": 0,
             "lp_sample_steps": 48 * 96 * 6, "train_passes": 48 * 24 * 6 * 5, "scored_images": 48 * 120,
             "eval_reward": 0.0}
    naive = {**paper, "fp_sample_steps": 0, "fp_pool_sample_steps": 48 * 96 * 10, "lp_sample_steps": 0,
             "scored_images": 48 * 96}
    for prices in (PRICES, PRICES_LOW_D, PRICES_HIGH_D):
        runs = {"sol_rl": {0: [paper]}, "naive_scaling": {0: [naive]}}
        add_modeled_cost(runs, prices=prices)
        assert paper["modeled_s"] == pytest.approx((125 + 62 + 240) * 8)
        assert naive["modeled_s"] == pytest.approx((451 + 240) * 8)  # Table 5's naive 691 s
    assert PRICES_LOW_D["lp_sample_steps"] / PRICES_LOW_D["fp_pool_sample_steps"] == pytest.approx(0.462, abs=1e-3)
    assert PRICES["lp_sample_steps"] / PRICES["fp_pool_sample_steps"] == pytest.approx(0.365, abs=1e-3)
    assert PRICES["fp_sample_steps"] == sd35.regen_s_per_sample_step
    assert (PRICES["scored_images"], PRICES_HIGH_D["scored_images"]) == (D_DEFAULT, D_HIGH)


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
    assert (configs["sol_rl_spread"].explore.schedule, configs["sol_rl_spread"].explore.spread_first) == ("spread", 48)
    grpo = configs["flow_grpo"]
    assert grpo.learner.objective == "flow_grpo" and int(grpo.learner.timestep_fraction * grpo.sampler.steps) == 9
    assert (grpo.learner.grpo.optimizer_steps, grpo.learner.grpo.timesteps, grpo.training.ema_every) == (2, "first", 8)
    assert (grpo.sampler.cfg_scale, configs["diffusionnft"].sampler.cfg_scale) == (4.5, 1.0)  # each its source's
    cfg1 = configs["flow_grpo_cfg1"]
    apart = {"sampler": {"cfg_scale"}}
    assert cfg1.sampler.cfg_scale == 1.0 and cfg1.model_dump(exclude=apart) == grpo.model_dump(exclude=apart)
    ema1 = configs["flow_grpo_ema_every1"]
    apart = {"training": {"ema_every"}}
    assert ema1.training.ema_every == 1 and ema1.model_dump(exclude=apart) == grpo.model_dump(exclude=apart)
    for reading in ("away_from_target", "trust_region"):
        art = configs[f"sol_rl_art_{reading}"].learner
        assert (art.objective, art.art.trust_mask, art.decay.type) == ("art", reading, 0)
    art = configs["diffusionnft_art"].learner  # the default reading without the pool
    assert (art.algorithm, art.objective, art.art.trust_mask, art.decay.type) == ("diffusionnft", "art",
                                                                                 "trust_region", 0)
    assert [configs[f"{name}_long"].learner.algorithm for name in ("diffusionnft", "sol_rl")] == ["diffusionnft",
                                                                                                 "sol_rl"]
    assert configs["sol_rl_shuffled"].learner.shuffle_rewards and not configs["sol_rl"].learner.shuffle_rewards


def test_old_run_files_get_the_scored_images_their_counter_would_have_given() -> None:
    """Points recorded before scored_images was counted: every image has one decode + reward, so it follows
    from the step counters and the named run's settings (per prompt: K-in-K 24 at 10 steps; Sol-RL's 96 at
    6 FP4 steps + 24; halving from 2 and 3 steps 96·f + 48·(6 − f) steps for 96 + 48, + 24; Flow-GRPO's
    CFG 4.5 two forwards a step, so half the images of CFG 1's steps)."""
    per_prompt = {"diffusionnft": (240, 0, 0, 24), "flow_grpo": (240, 0, 0, 12), "flow_grpo_cfg1": (240, 0, 0, 24),
                  "naive_scaling": (0, 960, 0, 96),
                  "naive_quant": (0, 0, 960, 96), "sol_rl": (240, 0, 576, 120), "sol_rl_explore2": (240, 0, 192, 120),
                  "sol_rl_pool48": (240, 0, 288, 72), "sol_rl_halving": (240, 0, 384, 168),
                  "sol_rl_halving3": (240, 0, 432, 168)}
    runs = {name: {0: [{"iteration": 3, "fp_sample_steps": 3 * 8 * fp, "fp_pool_sample_steps": 3 * 8 * pool,
                        "lp_sample_steps": 3 * 8 * lp, "train_passes": 0, "eval_reward": 0.0}]}
            for name, (fp, pool, lp, _) in per_prompt.items()}
    add_modeled_cost(runs)
    for name, (*_, scored) in per_prompt.items():
        point = runs[name][0][0]
        assert point["scored_images"] == 3 * 8 * scored, name
        assert point["modeled_s"] == pytest.approx(sum(point[k] * v for k, v in PRICES.items()))
    recorded = {"sol_rl": {0: [{**runs["sol_rl"][0][0], "scored_images": 7}]}}  # a new run's counter is kept
    add_modeled_cost(recorded)
    assert recorded["sol_rl"][0][0]["scored_images"] == 7
    with pytest.raises(ValueError, match="not a named run"):
        add_modeled_cost({"mystery": {0: [{k: v for k, v in runs["sol_rl"][0][0].items() if k != "scored_images"}]}})


def test_costs_replace_the_table_and_a_file_without_d_says_so(tmp_path, capsys) -> None:
    (tmp_path / "result.json").write_text(json.dumps({"args": {}, "runs": {
        "diffusionnft": {"0": raw_curve([-2.0, -1.0], fp=100, lp=0)},
        "sol_rl": {"0": raw_curve([-2.0, 0.0], fp=100, lp=60)}}}))
    measured = {"explore_s_per_sample_step": 0.01, "regen_s_per_sample_step": 0.02, "train_s_per_sample": 0.6}
    (tmp_path / "costs.json").write_text(json.dumps(measured))
    main(["--from-json", "--json", str(tmp_path / "result.json"), "--costs", str(tmp_path / "costs.json")])
    out = capsys.readouterr().out
    assert out.count("decode + reward per image d = 0 (no decode_reward_s_per_image in the costs file)") == 1
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["prices_gpu_s"] == {"fp_sample_steps": 0.02, "fp_pool_sample_steps": 0.02, "lp_sample_steps": 0.01,
                                       "train_passes": 0.02, "scored_images": 0.0}
    sol = written["runs"]["sol_rl"]["0"][1]  # 100 kept steps, 60 explore steps: 10 + 10 images (96 per 576 steps)
    assert sol["scored_images"] == 20 and sol["modeled_s"] == pytest.approx(100 * 0.02 + 60 * 0.01 + 5760 * 0.02)
    (tmp_path / "costs.json").write_text(json.dumps({**measured, "decode_reward_s_per_image": 0.5}))
    main(["--from-json", "--json", str(tmp_path / "result.json"), "--costs", str(tmp_path / "costs.json")])
    assert "d = 0" not in capsys.readouterr().out
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["prices_gpu_s"] == counter_prices(Costs(0.01, 0.02, 0.6, decode_reward_s_per_image=0.5))
    assert written["runs"]["sol_rl"]["0"][1]["modeled_s"] == pytest.approx(100 * 0.02 + 60 * 0.01 + 5760 * 0.02
                                                                           + 20 * 0.5)


class Stopped(Exception):
    """The process killed right after a checkpoint."""


def test_a_stopped_run_continues_from_its_last_checkpoint_to_the_same_points(tmp_path) -> None:
    config = tiny_config("run.iterations=4", "eval.every=2")
    whole = run_one(config, lambda *_, **__: None)

    def stop(*_, **__) -> None:
        raise Stopped

    folder = tmp_path / "partial" / "run"  # made by the run
    with pytest.raises(Stopped):  # the first point's log comes after its checkpoint (iteration 2)
        run_one(config, stop, folder)
    lines: list[str] = []
    resumed = run_one(config, lambda line, **_: lines.append(line), folder)
    assert lines[0].startswith("    resumed at iteration 2") and len(lines) == 2  # then only iteration 4's point

    def measured(points: list[dict]) -> str:  # all but this machine's seconds; NaN compares equal as text
        return json.dumps([{k: v for k, v in p.items() if k not in ("wall_s", "rollout_s", "train_s")}
                           for p in points])

    assert [p["iteration"] for p in resumed] == [0, 2, 4]
    assert measured(resumed) == measured(whole)
