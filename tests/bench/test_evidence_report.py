"""The evidence report: per-run files merged into the paper's tables, with targets never reached shown as such,
runs not made yet shown as pending, and each new table checked on synthetic runs whose answer is exact."""

from __future__ import annotations

import json
import math

import pytest

from bench.convergence import add_modeled_cost, first_reach, modeled_cost
from bench.evidence import PLAN, command, pending
from bench.evidence_plan import PREVIOUS_NAMES
from bench.evidence_report import (
    ADAPTIVE_RUNS,
    D_SETTINGS,
    adaptive_table,
    art_pool_section,
    art_table,
    break_even_q,
    break_even_table,
    convergence_table,
    deepest_dip,
    equal_time_table,
    grpo_objective_table,
    grpo_variant_note,
    level_speedup,
    load_all,
    lp_prices,
    moved_headlines,
    moved_table,
    objective_max,
    objective_mean,
    pool_pair,
    pool_pays_table,
    report,
    selection_section,
    splice,
    spread,
)
from bench.plan import save_costs
from bench.prices import D_DEFAULT, PRICES, Costs, fp4_ratio_at, prices_at

PASSES = 5760  # training passes per iteration: 8 prompts × 24 kept × 6 timesteps × 5 passes


def points(rewards: list[float], fp: float, lp: float = 0, pool: float = 0, scored: float = 0,
           accuracy: list[float] | None = None, objective: list[dict] | None = None) -> list[dict]:
    """One evaluation per iteration, counters cumulative as `bench.convergence.run_one` records them
    (per-iteration amounts given); `objective[i]` is the update's numbers of point i + 1."""
    out = []
    for i, r in enumerate(rewards):
        p = {"iteration": i, "wall_s": float(i), "rollout_s": 0.0, "train_s": float(i), "fp_sample_steps": i * fp,
             "fp_pool_sample_steps": i * pool, "lp_sample_steps": i * lp, "train_passes": i * PASSES,
             "scored_images": i * scored, "eval_reward": r,
             "eval_accuracy": 0.5 if accuracy is None else accuracy[i], "eval_digit_alignment": -1.0}
        if objective is not None and i > 0:
            p["objective"] = objective[i - 1]
        out.append(p)
    return out


def write(run_dir, name: str, seed: int, rewards: list[float], **counts) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{name}_seed{seed}.json").write_text(
        json.dumps({"args": {}, "runs": {name: {str(seed): points(rewards, **counts)}}}))


def per_iteration(prices: dict[str, float], fp: float = 0, lp: float = 0, scored: float = 0) -> float:
    """Modeled GPU-s of one iteration of `points(..., fp, lp, scored=scored)` at `prices`."""
    return fp * prices["fp_sample_steps"] + lp * prices["lp_sample_steps"] + scored * prices["scored_images"] \
        + PASSES * prices["train_passes"]


def linear_pair(seeds=(0, 1), nft: str = "diffusionnft", sol: str = "sol_rl", lp: float = 3000) -> dict:
    """diffusionnft gains 1 per iteration, sol_rl 2 (dearer per iteration by its lp steps): every level's
    speedup is 2 per iteration and 2·C_nft/C_sol in modeled time."""
    runs = {nft: {s: points([float(i) for i in range(11)], fp=100, scored=10) for s in seeds},
            sol: {s: points([2.0 * i for i in range(11)], fp=100, lp=lp, scored=110) for s in seeds}}
    add_modeled_cost(runs)
    return runs


def test_equal_time_rewards_are_interpolated_at_the_cheapest_runs_final_budget() -> None:
    runs = {"diffusionnft": {0: points([0.0, 1.0, 2.0, 3.0], fp=100)},
            "sol_rl": {0: points([0.0, 2.0, 4.0, 6.0], fp=100, lp=200)},  # dearer per iteration
            "flow_grpo": {0: points([0.0, 0.5, 1.0, 1.5], fp=100)}}
    add_modeled_cost(runs)
    _, table = equal_time_table(runs)
    budget = runs["diffusionnft"][0][-1]["modeled_s"]  # the cheapest final: diffusionnft's 3 iterations
    assert table["budget_s"][0] == budget
    per_it = runs["sol_rl"][0][1]["modeled_s"]
    assert table["reward"]["sol_rl"] == [pytest.approx(2.0 * budget / per_it)]
    assert table["reward"]["diffusionnft"] == [3.0] and table["reward"]["flow_grpo"] == [1.5]
    assert table["start"]["flow_grpo"] == [0.0]


def test_spread_keeps_per_seed_values_and_names_targets_never_reached() -> None:
    assert spread([1.0, 3.0, math.inf], 1) == "2.0 (1.0–3.0) [1.0, 3.0, never]"
    assert spread([math.nan], 2) == "never [never]"


def test_a_run_without_a_file_is_a_pending_row_in_every_table() -> None:
    runs = linear_pair()
    text, summary = convergence_table(runs, ("diffusionnft", "sol_rl", "sol_rl_spread"))
    assert "| sol_rl_spread | pending | — |" in text and "sol_rl_spread" not in summary
    assert summary["sol_rl"]["iteration"]["per_seed"] == [pytest.approx(2.0)] * 2
    text, table = equal_time_table(runs)
    assert "| flow_grpo | pending | pending | 0.3501 |" in text and table["pending"] == ["flow_grpo"]
    text, _ = grpo_objective_table(runs)
    assert "pending" in text
    text, table = art_table(runs)
    assert "| sol_rl_art_trust_region | pending |" in text and "Verdict: pending" in text
    text, table = adaptive_table(runs)
    assert all(f"| {name} | pending |" in text for name in ADAPTIVE_RUNS)
    assert "Pending (no run file yet): `sol_rl_halving`, `sol_rl_halving3`, `sol_rl_spread`." in text


def test_the_long_pair_is_used_when_present_and_its_own_baseline_sets_the_target() -> None:
    runs = linear_pair()
    baseline, run, note = pool_pair(runs)
    assert (baseline, run) == ("diffusionnft", "sol_rl") and "long pair is pending" in note
    long = linear_pair(nft="diffusionnft_long", sol="sol_rl_long", lp=6000)
    runs.update(long)
    baseline, run, note = pool_pair(runs)
    assert (baseline, run) == ("diffusionnft_long", "sol_rl_long") and "10 iterations" in note
    _, summary = convergence_table(runs, ("diffusionnft_long", "sol_rl_long"), "diffusionnft_long")
    c_nft = per_iteration(PRICES, fp=100, scored=10)
    c_sol = per_iteration(PRICES, fp=100, lp=6000, scored=110)
    assert summary["sol_rl_long"]["modeled_s"]["per_seed"] == [pytest.approx(2 * c_nft / c_sol)] * 2


def test_the_pool_under_art_is_judged_against_art_without_it() -> None:
    runs = linear_pair()
    text, pays, _ = art_pool_section(runs, None)
    assert text == "pending (`diffusionnft_art`, `sol_rl_art_trust_region`)." and pays == {}
    runs.update(linear_pair(seeds=(1, 2), nft="diffusionnft_art", sol="sol_rl_art_trust_region", lp=6000))
    text, pays, break_even = art_pool_section(runs, None)
    c_nft = per_iteration(PRICES, fp=100, scored=10)
    c_sol = per_iteration(PRICES, fp=100, lp=6000, scored=110)
    assert pays["seeds"] == break_even["seeds"] == [1, 2] and pays["baseline"] == "diffusionnft_art"
    assert pays["levels"][1.0]["modeled_s"] == [pytest.approx(2 * c_nft / c_sol)] * 2
    assert "Break-even price of a low-precision step under DiffusionART" in text


def test_two_linear_curves_give_their_known_speedup_at_every_level_and_budget() -> None:
    runs = linear_pair()
    c_nft = per_iteration(PRICES, fp=100, scored=10)
    c_sol = per_iteration(PRICES, fp=100, lp=3000, scored=110)
    text, table = pool_pays_table(runs, "diffusionnft", "sol_rl")
    for f, row in table["levels"].items():
        assert row["level"] == [pytest.approx(10 * f)] * 2
        assert row["iteration"] == [pytest.approx(2.0)] * 2
        assert row["modeled_s"] == [pytest.approx(2 * c_nft / c_sol)] * 2
    for f, row in table["equal_time"].items():
        budget = f * 10 * min(c_nft, c_sol)
        assert row["budget_s"] == [pytest.approx(budget)] * 2
        assert row["difference"] == [pytest.approx(budget * (2 / c_sol - 1 / c_nft))] * 2
        assert row["gain_ratio"] == [pytest.approx(2 * c_nft / c_sol)] * 2
    assert c_sol < 2 * c_nft  # training dominates at these counts: the pool pays at every level
    assert "pays (every seed ≥ 1×) at levels 10%, 20%" in text and "100%; it costs (every seed < 1× or never) at none" \
        in text


def test_a_level_never_reached_is_nan() -> None:
    base = points([0.0, 1.0, 2.0], fp=100)
    flat = points([0.0, 0.5, 0.5], fp=100)
    add_modeled_cost({"diffusionnft": {0: base, 1: flat}})
    assert math.isnan(level_speedup(base, flat, 1.0, "modeled_s"))
    assert level_speedup(base, flat, 0.25, "iteration") == pytest.approx(0.5)  # 0.5: at iteration 0.5 and 1


def test_the_break_even_q_solves_the_time_to_target_equation_exactly() -> None:
    # sol_rl reaches diffusionnft's final reward (10) in 5 iterations; its non-lp cost per iteration equals
    # diffusionnft's A, so 10·A = 5·(A + q·c_b·lp): q* = A/(c_b·lp) = ½ with lp = 2A/c_b.
    prices = prices_at(D_DEFAULT)
    a, c_b = per_iteration(prices, fp=100, scored=10), prices["fp_pool_sample_steps"]
    base = points([float(i) for i in range(11)], fp=100, scored=10)
    run = points([2.0 * i for i in range(11)], fp=100, lp=2 * a / c_b, scored=10)
    q = break_even_q(base, run, D_DEFAULT)
    assert q == pytest.approx(0.5)
    at = lp_prices(D_DEFAULT, q)
    assert first_reach([{**p, "modeled_s": modeled_cost(p, at)} for p in run], 10.0, "modeled_s") == \
        pytest.approx(first_reach([{**p, "modeled_s": modeled_cost(p, at)} for p in base], 10.0, "modeled_s"))
    # at the table's own q the repricing is the table
    assert lp_prices(D_DEFAULT, fp4_ratio_at(D_DEFAULT)) == pytest.approx(PRICES)
    # never reaching the target: no break-even; a run whose other work alone is dearer: q* < 0
    assert math.isnan(break_even_q(base, points([0.0] * 11, fp=100, lp=1000), D_DEFAULT))
    assert break_even_q(base, points([float(i) for i in range(11)], fp=200, lp=1000), D_DEFAULT) < 0


def test_the_break_even_table_sits_beside_the_tables_q_and_a_measured_fp8_price(tmp_path) -> None:
    prices = prices_at(D_DEFAULT)
    a, c_b = per_iteration(prices, fp=100, scored=10), prices["fp_pool_sample_steps"]
    runs = {"diffusionnft": {0: points([float(i) for i in range(11)], fp=100, scored=10)},
            "sol_rl": {0: points([2.0 * i for i in range(11)], fp=100, lp=2 * a / c_b, scored=10)}}
    add_modeled_cost(runs)
    text, table = break_even_table(runs, "diffusionnft", "sol_rl", tmp_path / "gpu_check")
    assert table["by_d"][D_SETTINGS[1][0]]["break_even_q"] == [pytest.approx(0.5)]
    assert "not measured here" in text and "q* = 0.500" in text and "is below the break-even" in text
    assert [row["table_q"] for row in table["by_d"].values()] == [pytest.approx(fp4_ratio_at(d)) for _, d in D_SETTINGS]
    save_costs(Costs(explore_s_per_sample_step=0.03, regen_s_per_sample_step=0.05, train_s_per_sample=1.0),
               tmp_path / "gpu_check" / "costs_sd35_large.json")
    text, table = break_even_table(runs, "diffusionnft", "sol_rl", tmp_path / "gpu_check")
    assert table["fp8_measured_q"] == {"sd35_large": pytest.approx(0.6)} and "sd35_large q = 0.600" in text
    (tmp_path / "gpu_check" / "gpu_check.json").write_text(json.dumps({"mode": "tiny", "device_name": "CPU"}))
    text, _ = break_even_table(runs, "diffusionnft", "sol_rl", tmp_path / "gpu_check")
    assert "tiny models on CPU: tiny models, not a price of the real ones" in text


def test_flow_grpos_logged_numbers_are_averaged_over_the_iterations_they_cover() -> None:
    pts = points([0.0, 1.0, 2.0], fp=100, objective=[
        {"clip_fraction": 0.1, "step1_clip_fraction": 0.0, "step2_clip_fraction": 0.2, "ratio_mean": 1.0,
         "approx_kl": 0.01},
        {"clip_fraction": 0.4, "step1_clip_fraction": 0.0, "step2_clip_fraction": 0.8, "ratio_mean": 1.2,
         "approx_kl": math.nan}])
    pts[2]["iteration"] = 3  # the first point covers 1 iteration, the second 2: weights 1 and 2
    assert objective_mean(pts, "clip_fraction") == pytest.approx((0.1 + 2 * 0.4) / 3)
    assert objective_mean(pts, "approx_kl") == pytest.approx(0.01)  # a nan is not logged, not a zero
    assert objective_max(pts, "ratio_mean") == 1.2 and math.isnan(objective_mean(pts, "drift_kl"))
    runs = {"diffusionnft": {0: points([0.0, 1.0, 2.0], fp=100)}, "flow_grpo": {0: pts}}
    add_modeled_cost(runs)
    text, table = grpo_objective_table(runs)
    assert table["binds"] and table["clip_fraction"] == [pytest.approx(0.3)]
    assert "The clip binds: 30.0%" in text and "| step2_clip_fraction | 0.6000" in text


@pytest.mark.parametrize("variant", ["flow_grpo_ema_every1", "flow_grpo_cfg1"])
def test_a_flow_grpo_variant_note_compares_the_seeds_both_runs_have(variant: str) -> None:
    runs = {"flow_grpo": {0: points([0.0, 5.0], fp=1), 1: points([2.0, 6.0], fp=1)},
            variant: {1: points([0.5, 9.0], fp=1, accuracy=[0.5, 0.8])}}
    text, table = grpo_variant_note(runs, variant)
    assert table["seeds"] == [1] and table["flow_grpo"]["final_reward"] == [6.0]
    assert table["flow_grpo"]["start_reward"] == [2.0] and table[variant]["start_reward"] == [0.5]
    assert table[variant]["final_accuracy"] == [0.8] and f"(`{variant}`) | [1] | 0.500" in text
    text, table = grpo_variant_note({"flow_grpo": runs["flow_grpo"]}, variant)
    assert table["seeds"] == [] and f"not measured (`python -m bench.convergence --runs {variant}" in text


def test_the_deepest_dip_is_the_largest_drop_below_an_earlier_peak() -> None:
    pts = points([0.0] * 7, fp=1, accuracy=[0.5, 0.8, 0.7, 0.9, 0.75, 0.85, 0.95])
    assert deepest_dip(pts) == (0.75, 4, pytest.approx(0.15))  # not the start's 0.5, which no peak preceded
    assert deepest_dip(points([0.0] * 3, fp=1, accuracy=[0.5, 0.6, 0.7])) == (0.7, 2, 0.0)


def test_the_art_verdict_is_computed_from_drift_and_accuracy() -> None:
    def art(drift: float, dip: float, seed: int) -> list[dict]:
        acc = [0.5, 0.9, 0.9 - dip, 0.95]
        return points([0.0, 1.0, 2.0, 3.0], fp=100, lp=100, accuracy=acc, objective=[
            {"drift_kl": drift / 2, "window1_masked_fraction": 0.1, "window2_masked_fraction": 0.3,
             "window2_restore_to_guidance": 0.5},
            {"drift_kl": drift, "window1_masked_fraction": 0.1, "window2_masked_fraction": 0.3,
             "window2_restore_to_guidance": 0.5},
            {"drift_kl": drift / 4, "window1_masked_fraction": 0.1, "window2_masked_fraction": 0.3,
             "window2_restore_to_guidance": 0.5}])

    runs = {"diffusionnft": {s: points([0.0, 1.0, 2.0, 3.0], fp=100) for s in (0, 1)},
            "sol_rl_art_away_from_target": {s: art(0.8 + 0.1 * s, 0.2, s) for s in (0, 1)},
            "sol_rl_art_trust_region": {s: art(0.1 + 0.01 * s, 0.05, s) for s in (0, 1)}}
    add_modeled_cost(runs)
    text, table = art_table(runs)
    row = table["sol_rl_art_away_from_target"]
    assert row["drift_kl_max"] == [pytest.approx(0.8), pytest.approx(0.9)]
    assert row["drift_kl_mean"][0] == pytest.approx((0.4 + 0.8 + 0.2) / 3)
    assert row["dip_drop"] == [pytest.approx(0.2)] * 2 and row["dip_iteration"] == [2, 2]
    assert row["window2_masked_fraction_mean"] == [pytest.approx(0.3)] * 2
    assert "`sol_rl_art_trust_region` bounds drift better" in table["verdict"]
    assert "`sol_rl_art_trust_region` holds accuracy better" in table["verdict"]
    assert "outside the seed spread" in table["verdict"] and "does both" in table["verdict"]
    assert "| sol_rl | pending |" in text and "| diffusionnft | 2 |" in text
    assert "diffusionnft_art" not in text  # ART without the pool: a row only when it ran, never pending
    runs["diffusionnft_art"] = {0: art(0.3, 0.1, 0)}
    add_modeled_cost(runs)
    text, table = art_table(runs)
    assert table["diffusionnft_art"]["drift_kl_max"] == [pytest.approx(0.3)] and "| diffusionnft_art | 1 |" in text
    assert "diffusionnft_art" not in table["verdict"]
    del runs["diffusionnft_art"]
    runs["sol_rl_art_trust_region"] = {s: art(0.1, 0.2 - 0.01 * s, s) for s in (0, 1)}  # dips overlap: no winner
    add_modeled_cost(runs)
    verdict = art_table(runs)[1]["verdict"]
    assert "deepest accuracy drop does not separate the readings" in verdict and "does both" not in verdict


def test_adaptive_schedules_are_repriced_at_each_d_and_judged_against_the_fixed_passs_spread() -> None:
    # Every run reaches diffusionnft's final reward (10) at iteration 5, so the time ratio to the fixed pass is
    # the per-iteration cost ratio: the scheme trades half the lp steps for twice the scored images.
    rewards = [2.0 * i for i in range(11)]
    runs = {"diffusionnft": {s: points([float(i) for i in range(11)], fp=100, scored=10) for s in (0, 1, 2)},
            "sol_rl": {s: points(rewards, fp=100, lp=3000, scored=500) for s in (0, 1, 2)},
            "sol_rl_halving": {s: points(rewards, fp=100, lp=1500, scored=1000) for s in (0, 1, 2)},
            "sol_rl_spread": {s: points(rewards, fp=100, lp=3000, scored=500) for s in (0, 1)}}
    add_modeled_cost(runs)
    text, table = adaptive_table(runs)
    for label, d in D_SETTINGS:
        prices = prices_at(d)
        fixed = per_iteration(prices, fp=100, lp=3000, scored=500)
        halving = per_iteration(prices, fp=100, lp=1500, scored=1000)
        assert table["sol_rl"]["time_s"][label] == [pytest.approx(5 * fixed)] * 3
        assert table["sol_rl_halving"]["ratio"][label] == [pytest.approx(halving / fixed)] * 3
        assert table["sol_rl_spread"]["ratio"][label] == [pytest.approx(1.0)] * 2
        assert table["sol_rl_spread"]["verdict"][label].startswith("within the fixed pass's seed spread")
        verdict = table["sol_rl_halving"]["verdict"][label]
        assert verdict.startswith("beats" if halving < fixed else "slower")
    assert "| sol_rl_halving3 | pending |" in text and "`sol_rl_spread` (2 seeds" in text


def test_the_selection_section_formats_the_benchs_json_with_its_module_or_says_why_not(tmp_path,
                                                                                        monkeypatch) -> None:
    from bench import selection_stats

    _, text = selection_section(tmp_path)
    assert "Not measured yet" in text
    (tmp_path / "selection_stats.json").write_text(json.dumps({"pools": [24, 48], "per_prompt": [{}] * 3}))
    monkeypatch.setattr(selection_stats, "format_tables", lambda data: f"TABLES OF {data['pools']}")
    _, text = selection_section(tmp_path)
    assert text.startswith("3 prompts") and text.endswith("TABLES OF [24, 48]")

    def stale(data: dict) -> str:
        raise KeyError("a key this file predates")

    monkeypatch.setattr(selection_stats, "format_tables", stale)
    assert "does not match bench.selection_stats' format" in selection_section(tmp_path)[1]


def test_report_builds_every_table_from_per_run_files(tmp_path) -> None:
    runs, results, doc = tmp_path / "runs", tmp_path / "results", tmp_path / "evidence.md"
    discussion = tmp_path / "benchmarks.md"
    discussion.write_text("# Benchmarks\n\nprose\n<!-- evidence:begin -->\nstale\n<!-- evidence:end -->\nmore prose\n")
    for seed in (0, 1):
        write(runs, "diffusionnft", seed, [0.0, 1.0, 2.0], fp=100)
        write(runs, "sol_rl", seed, [0.0, 2.0, 4.0], fp=100, lp=10)
        write(runs, "flow_grpo", seed, [0.0, 0.1, 0.2], fp=100)  # never reaches diffusionnft's 2.0
    results.mkdir()
    (results / "evidence_long.png").write_bytes(b"an earlier report's figure of runs no longer here")
    report(runs, results, doc, discussion)
    assert not (results / "evidence_long.png").exists()
    numbers = json.loads((results / "evidence.json").read_text())["tables"]
    assert numbers["convergence"]["sol_rl"]["iteration"]["per_seed"] == [pytest.approx(2.0)] * 2
    assert numbers["convergence"]["flow_grpo"]["iteration"]["per_seed"] == [0.0, 0.0]
    assert numbers["pool_pays"]["run"] == "sol_rl" and numbers["break_even"]["seeds"] == [0, 1]
    text = doc.read_text()
    assert "| flow_grpo | 2 | 0.200 (0.200–0.200) [0.200, 0.200] |" in text
    assert "never [never, never]" in text
    assert "| sol_rl_art_away_from_target | pending |" in text and "| sol_rl_long | pending |" in text
    assert "long pair is pending" in text and "Flow-GRPO's update: not logged" in text
    assert "`sol_rl_spread` seed 2" in text  # the inventory names what is still expected
    assert numbers["table2"]["sol_rl"]["final"] == [4.0, 4.0]  # 6 explore steps: the default sol_rl run
    assert (results / "evidence_algorithms.png").stat().st_size > 0
    assert (results / "evidence_speedup.png").stat().st_size > 0
    spliced = discussion.read_text()
    assert spliced.startswith("# Benchmarks\n\nprose\n") and spliced.endswith("<!-- evidence:end -->\nmore prose\n")
    assert "stale" not in spliced and "#### Table 1" in spliced and "never [never, never]" in spliced
    assert "Runs in this report" not in spliced  # the inventory stays in the generated file
    report(runs, results, doc, discussion)
    assert discussion.read_text() == spliced  # a second report replaces the tables, nothing piles up


def test_what_moved_compares_each_run_with_its_previous_self_on_the_seeds_both_have(tmp_path) -> None:
    """Before: sol_rl reaches diffusionnft's final 2.0 when it does (speedup 1); now it reaches 2.0 at iteration 1
    (speedup 2) and ends at 4.0 (+2.0). Seed 1 exists only now: left out; a run only in one set is not listed."""
    now, before = tmp_path / "now", tmp_path / "before"
    for seed in (0, 1):
        write(now, "diffusionnft", seed, [0.0, 1.0, 2.0], fp=100)
        write(now, "sol_rl", seed, [0.0, 2.0, 4.0], fp=100, lp=10)
    write(before, "diffusionnft", 0, [0.0, 1.0, 2.0], fp=100)
    write(before, "sol_rl", 0, [0.0, 1.0, 2.0], fp=100, lp=10)
    write(now, "flow_grpo", 0, [0.0, 0.1, 0.2], fp=100)
    text, out = moved_table(load_all(now), load_all(before), "A → B")
    assert set(out) == {"diffusionnft", "sol_rl"} and out["sol_rl"]["seeds"] == [0]
    assert out["sol_rl"]["before"]["iteration"] == [pytest.approx(1.0)]
    assert out["sol_rl"]["now"]["iteration"] == [pytest.approx(2.0)]
    assert out["sol_rl"]["delta_final"] == pytest.approx(2.0) and out["diffusionnft"]["delta_final"] == 0.0
    assert text.startswith("Before: A; now: B.") and "| sol_rl | [0] | 2.000 (2.000–2.000) [2.000] |" in text
    results, doc = tmp_path / "results", tmp_path / "evidence.md"
    report(now, results, doc, None, previous_dir=before)
    assert "## What moved from the previous evidence" in doc.read_text()
    report(now, results, doc, None)
    assert "What moved" not in doc.read_text()


def test_the_headlines_compare_both_sets_on_their_shared_runs_and_flow_grpo_at_cfg1_with_its_old_self(
        tmp_path) -> None:
    """Table 1 of each set on the (run, seed) pairs both have: now's seed 1 and now-only runs change nothing.
    The previous `flow_grpo` (sampled at CFG 1) is compared with today's `flow_grpo_cfg1`, not the CFG 4.5 run."""
    now, before = tmp_path / "now", tmp_path / "before"
    write(now, "diffusionnft", 0, [0.0, 1.0, 2.0], fp=100)
    write(now, "sol_rl", 0, [0.0, 2.0, 4.0], fp=100, lp=10)
    write(now, "sol_rl", 1, [0.0, 9.0, 9.0], fp=100, lp=10)
    write(before, "diffusionnft", 0, [0.0, 1.0, 2.0], fp=100)
    write(before, "sol_rl", 0, [0.0, 1.0, 2.0], fp=100, lp=10)
    write(before, "flow_grpo", 0, [0.0, 0.5, 1.0], fp=100)
    write(now, "flow_grpo_cfg1", 0, [0.0, 0.5, 1.5], fp=100)
    write(now, "flow_grpo", 0, [5.0, 5.5, 6.0], fp=200)
    previous = {PREVIOUS_NAMES.get(n, n): v for n, v in load_all(before).items()}
    _, out = moved_headlines(load_all(now), previous)
    key = "Table 1, sol_rl at equal modeled time"
    # sol_rl read at diffusionnft's final budget 2·C_nft: its reward slope per modeled second times that budget
    iterations_at_budget = 2 * per_iteration(PRICES, fp=100) / per_iteration(PRICES, fp=100, lp=10)
    assert out[key]["now"] == pytest.approx(2.0 * iterations_at_budget)
    assert out[key]["before"] == pytest.approx(1.0 * iterations_at_budget)
    assert "Table 1, flow_grpo at equal modeled time" not in out
    results, doc = tmp_path / "results", tmp_path / "evidence.md"
    report(now, results, doc, None, previous_dir=before)
    moved = json.loads((results / "evidence.json").read_text())["tables"]["moved"]
    assert "flow_grpo" not in moved and moved["flow_grpo_cfg1"]["delta_final"] == pytest.approx(0.5)


def test_report_reads_the_long_pair_when_its_files_exist(tmp_path) -> None:
    runs, results, doc = tmp_path / "runs", tmp_path / "results", tmp_path / "evidence.md"
    for seed in (0, 1):
        write(runs, "diffusionnft", seed, [0.0, 1.0, 2.0], fp=100)
        write(runs, "diffusionnft_long", seed, [float(i) for i in range(11)], fp=100)
        write(runs, "sol_rl_long", seed, [2.0 * i for i in range(11)], fp=100, lp=10)
    report(runs, results, doc, None)
    numbers = json.loads((results / "evidence.json").read_text())["tables"]
    assert numbers["pool_pays"]["baseline"] == "diffusionnft_long"
    assert numbers["convergence_long"]["sol_rl_long"]["iteration"]["per_seed"] == [pytest.approx(2.0)] * 2
    assert "From the long pair (10 iterations)" in doc.read_text()
    assert (results / "evidence_long.png").stat().st_size > 0


def test_splice_refuses_a_document_without_markers(tmp_path) -> None:
    doc = tmp_path / "plain.md"
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the markers"):
        splice(doc, "tables")
    assert doc.read_text() == "no markers\n"


def test_the_suite_skips_runs_already_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = PLAN[0]
    assert pending(None, None)[0] == first
    (tmp_path / "bench/results/runs").mkdir(parents=True)
    (tmp_path / f"bench/results/runs/{first[0]}_seed{first[1]}.json").write_text("{}")
    assert first not in pending(None, None) and len(pending(None, None)) == len(PLAN) - 1
    args = command(*first)
    assert args[args.index("--json") + 1] == f"bench/results/runs/{first[0]}_seed{first[1]}.json"
    assert args[args.index("--resume-dir") + 1] == "bench/results/runs/partial"  # a killed run continues
