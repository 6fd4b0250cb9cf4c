"""The capacity plan: its formulas on hand-computed cases, the paper's anchor, the optimizer, the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from bench.plan import (
    MODELS,
    PAPER_SHAPE,
    Costs,
    PlanError,
    Shape,
    all_layouts,
    best_split,
    colocated_actors_s,
    colocated_s,
    explore_wall,
    layout,
    load_costs,
    main,
    paper_costs,
    plan,
    save_costs,
    speedup,
    split_s,
    streamed_regen_end,
    work,
)

# P = 4 prompts, N = 2 candidates, K = 1 kept, one step each: W_x = 8, W_r = 8, W_t = 12 GPU-seconds;
# one group explores in g = 2 s, one kept seed regenerates in 2 s on one learner.
SMALL = Shape(prompts=4, candidates=2, keep=1, explore_steps=1, regen_steps=1)
COSTS = Costs(explore_s_per_sample_step=1.0, regen_s_per_sample_step=2.0, train_s_per_sample=3.0,
              sync_s=0.5, overhead_s=0.25)


def test_the_building_blocks_on_hand_computed_cases() -> None:
    assert work(COSTS, SMALL) == (8.0, 8.0, 12.0)
    assert speedup(1, 0.5) == 1.0
    assert speedup(3, 0.5) == 2.0
    assert speedup(4, 1.0) == 4.0
    assert explore_wall(48, 2.0, 7) == 14.0  # ceil(48/7) = 7 groups on the busiest explorer
    assert explore_wall(48, 2.0, 8) == 12.0
    # waves of 3, 3, 1 groups at 1, 2, 3 s; 0.5 s per group: max(1 + 3.5, 2 + 2, 3 + 0.5) = 4.5
    assert streamed_regen_end(7, 3, 1.0, 0.5) == 4.5
    # regeneration faster than arrivals: the last group's own regeneration after the last wave
    assert streamed_regen_end(7, 3, 10.0, 0.5) == 30.5


def test_split_and_colocated_formulas_on_hand_computed_cases() -> None:
    # 2E+2L: X = ceil(4/2)·2 = 4, R = 8/2 = 4, Tr = 12/2 = 6, s = 0.5, o = 0.25
    assert split_s(COSTS, SMALL, 2, 2, "sync", False) == 14.75
    assert split_s(COSTS, SMALL, 2, 2, "async", False) == 10.75  # max(4, 4 + 6 + 0.5) + 0.25
    # waves of 2 groups at 2 and 4 s, 1 s per group on 2 learners: max(2 + 4, 4 + 2) = 6; 6 + 6 + 0.75
    assert split_s(COSTS, SMALL, 2, 2, "sync", True) == 12.75
    # 1E+3L at efficiency 0.5: u = 2; X = 8, R = 4, Tr = 6
    assert split_s(COSTS, SMALL, 1, 3, "sync", False, efficiency=0.5) == 18.75
    assert split_s(COSTS, SMALL, 1, 3, "async", False, efficiency=0.5) == 10.75  # max(8, 10.5) + 0.25
    assert colocated_s(COSTS, SMALL, 2) == 14.75  # 2·2 + (8 + 12)/2 + 0.75
    assert colocated_s(COSTS, SMALL, 3) == pytest.approx(28 / 3 + 0.75)  # candidates shard over every GPU
    assert colocated_s(COSTS, SMALL, 3, efficiency=0.5) == pytest.approx(8 / 3 + 20 / 2 + 0.75)
    c = layout(COSTS, SMALL, 2, 2, "async", False)
    assert c.seconds == 10.75
    assert c.explorer_idle == pytest.approx(1 - 8 / (2 * 10.75))
    assert c.learner_idle == pytest.approx(1 - 20 / (2 * 10.75))


def test_the_colocated_layout_reproduces_the_paper_for_sd35_large() -> None:
    costs = paper_costs("sd35_large")
    w_x, w_r, w_t = work(costs, PAPER_SHAPE)
    assert (w_x / 8, w_r / 8, w_t / 8) == pytest.approx((125.0, 62.0, 240.0))
    assert colocated_s(costs, PAPER_SHAPE, 8) == pytest.approx(427.0)
    naive_step = 451 * 8 / (48 * 96 * 10)
    assert costs.explore_s_per_sample_step / naive_step == pytest.approx(0.462, abs=1e-3)


@pytest.mark.parametrize(("model", "naive_s", "rollout_s"), [("flux_dev", 274.0, 169.0), ("sana_1600m", 95.0, 76.0)])
def test_derived_costs_reproduce_the_published_rollout_totals(model: str, naive_s: float, rollout_s: float) -> None:
    costs = paper_costs(model)
    w_x, w_r, _ = work(costs, PAPER_SHAPE)
    assert (w_x + w_r) / 8 == pytest.approx(rollout_s)
    sd35 = paper_costs("sd35_large")
    assert costs.regen_s_per_sample_step / sd35.regen_s_per_sample_step == pytest.approx(naive_s / 451)
    assert costs.train_s_per_sample / sd35.train_s_per_sample == pytest.approx(naive_s / 451)


def random_cases(n: int) -> list[tuple[Costs, Shape, int, float]]:
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(n):
        costs = Costs(*(float(v) for v in rng.uniform(0.01, 2.0, 3)), sync_s=float(rng.uniform(0, 5)),
                      overhead_s=float(rng.uniform(0, 5)))
        keep = int(rng.integers(1, 17))
        shape = Shape(prompts=int(rng.integers(1, 65)), candidates=keep + int(rng.integers(0, 64)), keep=keep,
                      explore_steps=int(rng.integers(1, 11)), regen_steps=int(rng.integers(1, 41)))
        cases.append((costs, shape, int(rng.integers(2, 41)), float(rng.uniform(0.3, 1.0))))
    return cases


def test_async_and_streaming_never_slower() -> None:
    cases = [(paper_costs(m), PAPER_SHAPE, g, 1.0) for m in MODELS for g in (2, 8, 16, 64)] + random_cases(200)
    for costs, shape, gpus, eff in cases:
        for e in range(1, gpus):
            sync = split_s(costs, shape, e, gpus - e, "sync", False, eff)
            assert split_s(costs, shape, e, gpus - e, "async", False, eff) <= sync + 1e-9
            assert split_s(costs, shape, e, gpus - e, "sync", True, eff) <= sync + 1e-9
            assert split_s(costs, shape, e, gpus - e, "async", True, eff) <= sync + 1e-9


def test_no_split_beats_colocated() -> None:
    # Splitting moves work between GPUs, never removes it: every layout needs at least (W_x + W_r + W_t)/G.
    # Without weight sync and at e = 1. Async hides s behind exploration, and at e < 1 fewer learners lose
    # less to data parallelism: then a split can win.
    for costs, shape, gpus, _ in random_cases(100):
        costs = replace(costs, sync_s=0.0)
        reference = colocated_s(costs, shape, gpus)
        assert all(c.seconds >= reference - 1e-9 for c in all_layouts(costs, shape, gpus))


@pytest.mark.parametrize(("mode", "streamed"), [("sync", False), ("sync", True), ("async", False)])
def test_the_optimizer_finds_the_brute_force_best(mode: str, streamed: bool) -> None:
    cases = [(paper_costs(m), PAPER_SHAPE, g, 1.0) for m in MODELS for g in range(2, 65)] + random_cases(300)
    for costs, shape, gpus, eff in cases:
        brute = min(split_s(costs, shape, e, gpus - e, mode, streamed, eff) for e in range(1, gpus))
        assert best_split(costs, shape, gpus, mode, streamed, eff).seconds == pytest.approx(brute, rel=1e-12)


def test_sd35_large_on_8_gpus() -> None:
    result = plan(paper_costs("sd35_large"), PAPER_SHAPE, 8)
    assert result["colocated_s"] == pytest.approx(427.0)
    best = result["best"]
    assert (best["async"]["explorers"], best["async"]["seconds"]) == (3, pytest.approx(2416 / 5))
    assert best["sync_streamed"]["seconds"] < best["sync"]["seconds"]
    assert all(b["seconds"] > 427.0 for b in best.values())  # ceil(48/E) leaves no split exactly balanced
    preset = layout(paper_costs("sd35_large"), PAPER_SHAPE, 7, 1, "sync", False)
    assert preset.seconds == pytest.approx(7 * 125 * 8 / 48 + 62 * 8 + 240 * 8)


def test_costs_file_round_trip(tmp_path: Path) -> None:
    costs = Costs(0.1, 0.2, 3.0, sync_s=1.5)
    save_costs(costs, tmp_path / "costs.json")
    assert load_costs(tmp_path / "costs.json") == costs
    (tmp_path / "minimal.json").write_text(json.dumps(
        {"explore_s_per_sample_step": 0.1, "regen_s_per_sample_step": 0.2, "train_s_per_sample": 3}))
    assert load_costs(tmp_path / "minimal.json") == Costs(0.1, 0.2, 3.0)


def test_the_cli_prints_the_table_and_writes_json_that_feeds_back(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    main(["--gpus", "8", "--json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert "| split | mode | iteration s | vs colocated | explorers idle | learners idle |" in out
    assert "| colocated 8 GPUs | sync | 427.0 | 1.00 |" in out
    assert "| 3E+5L | async | 483.2 | 1.13 |" in out
    assert "best async: 3E+5L, 483.2 s" in out
    assert "the preset's layout (3E+5L, sync, streamed): 723.5 s" in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["costs"] == asdict(paper_costs("sd35_large"))
    assert len(written["layouts"]) == 3 * 7
    assert (written["preset"]["explorers"], written["preset"]["learners"]) == (3, 5)
    assert written["preset"]["seconds"] == written["best"]["sync_streamed"]["seconds"]
    main(["--gpus", "8", "--costs", str(tmp_path / "plan.json"), "--json", str(tmp_path / "again.json")])
    assert "costs from file" in capsys.readouterr().out
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["layouts"] == written["layouts"]


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_bad_input_names_the_problem_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_error(["--gpus", "1"], capsys)
    assert "--gpus 1" in err and "at least 2" in err and "--gpus 2 or more" in err
    err = cli_error(["--gpus", "8", "--model", "sd15"], capsys)
    assert "invalid choice: 'sd15'" in err and "sd35_large" in err
    with pytest.raises(PlanError, match=r"unknown model 'sd15'.*--costs FILE"):
        paper_costs("sd15")
    (tmp_path / "partial.json").write_text(json.dumps({"explore_s_per_sample_step": 0.1,
                                                       "regen_s_per_sample_step": 0.2}))
    err = cli_error(["--gpus", "8", "--costs", str(tmp_path / "partial.json")], capsys)
    assert "missing field 'train_s_per_sample'" in err and "add it" in err
    err = cli_error(["--gpus", "8", "--costs", str(tmp_path / "absent.json")], capsys)
    assert "does not exist" in err
    err = cli_error(["--gpus", "8", "--learner-efficiency", "0"], capsys)
    assert "(0, 1]" in err
    (tmp_path / "typo.json").write_text(json.dumps({"explore_s_per_step": 0.1}))
    with pytest.raises(PlanError, match="unknown field 'explore_s_per_step'"):
        load_costs(tmp_path / "typo.json")
    (tmp_path / "negative.json").write_text(json.dumps({"explore_s_per_sample_step": -1, "regen_s_per_sample_step": 1,
                                                        "train_s_per_sample": math.nan}))
    with pytest.raises(PlanError, match="explore_s_per_sample_step must be a finite number >= 0"):
        load_costs(tmp_path / "negative.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_costs(tmp_path / "broken.json")


def test_colocated_actors_match_the_papers_layout_when_the_gpus_divide_the_prompts() -> None:
    """G explorers + G learner ranks sharing G GPUs: explorers take whole prompts, so only G | P is exact."""
    costs = paper_costs("sd35_large")
    assert colocated_actors_s(costs, PAPER_SHAPE, 8) == pytest.approx(427.0)
    group = 96 * 6 * costs.explore_s_per_sample_step
    extra = (math.ceil(48 / 5) - 48 / 5) * group  # 10 waves of prompts where 9.6 would balance
    assert colocated_actors_s(costs, PAPER_SHAPE, 5) == pytest.approx(colocated_s(costs, PAPER_SHAPE, 5) + extra)
