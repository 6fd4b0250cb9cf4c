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
    learner_speedup,
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
    # u_P(L) = u(L)·(P/L)/ceil(P/L): the busiest rank's whole slots set the pace
    assert learner_speedup(48, 5, 1.0) == pytest.approx(4.8)  # 10 slots on the busiest where 9.6 would balance
    assert learner_speedup(48, 40, 1.0) == pytest.approx(24.0)  # 2 slots on the busiest: 24 learners' worth
    assert learner_speedup(48, 64, 1.0) == pytest.approx(48.0)  # 16 ranks without a slot
    assert learner_speedup(48, 4, 0.5) == speedup(4, 0.5)  # 4 divides 48
    assert learner_speedup(7, 3, 0.5) == pytest.approx(2 * (7 / 3) / 3)
    # Groups of slots 0–2 arrive at 1 s, 3–5 at 2 s, 6 at 3 s (explorer s mod 3, one group at a time).
    # One learner, 0.5 s per group: it works through them in order, the last ends at 3 + 0.5 (behind by 1 s).
    assert streamed_regen_end(7, 3, 1, 1.0, 0.5) == 4.5
    # 3 ranks (owner_of: slots 0–5 s mod 3, slot 6 to rank 2): rank 2 ends 3 + 0.5 after slot 6 arrives
    assert streamed_regen_end(7, 3, 3, 1.0, 0.5) == 3.5
    # 2 ranks, 2 s per group: rank 1 owns slots 1, 3, 5, 6 and is busy from 1 s on: 1 + 4·2
    assert streamed_regen_end(7, 3, 2, 1.0, 2.0) == 9.0
    # regeneration faster than arrivals: the last group's own regeneration after the last wave
    assert streamed_regen_end(7, 3, 2, 10.0, 0.5) == 30.5


def test_split_and_colocated_formulas_on_hand_computed_cases() -> None:
    # 2E+2L: X = ceil(4/2)·2 = 4, R = 8/2 = 4, Tr = 12/2 = 6, s = 0.5, o = 0.25
    assert split_s(COSTS, SMALL, 2, 2, "sync", False) == 14.75
    assert split_s(COSTS, SMALL, 2, 2, "async", False) == 10.75  # max(4, 4 + 6 + 0.5) + 0.25
    # waves of 2 groups at 2 and 4 s, 1 s per group on 2 learners: max(2 + 4, 4 + 2) = 6; 6 + 6 + 0.75
    assert split_s(COSTS, SMALL, 2, 2, "sync", True) == 12.75
    # 1E+3L: 4 slots over 3 ranks, the busiest (rank 2) trains 2: u_P = 3·(4/3)/2 = 2; X = 8, R = 4, Tr = 6
    assert split_s(COSTS, SMALL, 1, 3, "sync", False) == 18.75
    # groups arrive at 2, 4, 6, 8 s; rank 2 owns slots 2 and 3: 6 → 8, 8 → 10; then Tr = 6, s + o
    assert split_s(COSTS, SMALL, 1, 3, "sync", True) == 16.75
    # at efficiency 0.5: u = 2, each rank at 2/3 of a learner: u_P = 2·(4/3)/2 = 4/3; R = 6, Tr = 9
    assert split_s(COSTS, SMALL, 1, 3, "sync", False, efficiency=0.5) == 23.75
    assert split_s(COSTS, SMALL, 1, 3, "async", False, efficiency=0.5) == 15.75  # max(8, 15.5) + 0.25
    assert split_s(COSTS, SMALL, 1, 3, "sync", True, efficiency=0.5) == 6 + 2 * 1.5 + 3 + 9 + 0.75  # rank 2: 6 → 9 → 12
    assert colocated_s(COSTS, SMALL, 2) == 14.75  # 2·2 + (8 + 12)/2 + 0.75
    assert colocated_s(COSTS, SMALL, 3) == pytest.approx(28 / 3 + 0.75)  # candidates and samples shard over every GPU
    assert colocated_s(COSTS, SMALL, 3, efficiency=0.5) == pytest.approx(8 / 3 + 20 / 2 + 0.75)
    assert colocated_actors_s(COSTS, SMALL, 3) == 2 * 2 + 20 / 2 + 0.75  # whole slots: 2 on the busiest of each
    c = layout(COSTS, SMALL, 2, 2, "async", False)
    assert c.seconds == 10.75
    assert c.explorer_idle == pytest.approx(1 - 8 / (2 * 10.75))
    assert c.learner_idle == pytest.approx(1 - 20 / (2 * 10.75))


def test_the_colocated_layout_reproduces_the_paper_for_sd35_large() -> None:
    costs = paper_costs("sd35_large")
    w_x, w_r, w_t = work(costs, PAPER_SHAPE)
    assert (w_x / 8, w_r / 8, w_t / 8) == pytest.approx((125.0, 62.0, 240.0))
    assert colocated_s(costs, PAPER_SHAPE, 8) == pytest.approx(427.0)
    # per image, decode and reward included: explore 6·c_x + d, naive 10·c_b + d (bench.prices); at d = 0 the
    # FP4 step is the paper's 0.46 of a BF16 one, at the default d (the bracket's midpoint) 0.365
    naive_image, d = 451 * 8 / (48 * 96), costs.decode_reward_s_per_image
    assert costs.explore_s_per_sample_step / ((naive_image - d) / 10) == pytest.approx(0.365, abs=1e-3)
    undivided = paper_costs("sd35_large", d=0.0)
    assert undivided.explore_s_per_sample_step / (naive_image / 10) == pytest.approx(0.462, abs=1e-3)
    assert work(undivided, PAPER_SHAPE) == pytest.approx(work(costs, PAPER_SHAPE))


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
    g, slot = 125 * 8 / 48, (62 + 240) * 8 / 48  # one group explored; one slot regenerated and trained
    # whole slots: 2E+6L (24 groups, 8 slots) where slots taken as divisible made 3E+5L (16 groups, 9.6 slots) best
    assert (best["async"]["explorers"], best["async"]["seconds"]) == (2, pytest.approx(24 * g))
    assert result["layouts"][2 * 7 + 2]["seconds"] == pytest.approx(10 * slot)  # 3E+5L async: 10 slots, 503.3 s
    assert (best["sync"]["explorers"], best["sync"]["seconds"]) == (3, pytest.approx(16 * g + 10 * slot))
    # 4E+4L streamed: the last wave at 12·g, its group regenerated on its rank, then 12 slots trained
    assert (best["sync_streamed"]["explorers"], best["sync_streamed"]["seconds"]) == \
        (4, pytest.approx(12 * g + 62 * 8 / 48 + 12 * 240 * 8 / 48))
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
    assert "| 3E+5L | async | 503.3 | 1.18 |" in out
    assert "best async: 2E+6L, 500.0 s" in out
    assert "best sync streamed: 4E+4L, 740.3 s" in out
    assert "the preset's layout (4E+4L, sync, streamed): 740.3 s" in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["costs"] == asdict(paper_costs("sd35_large"))
    assert len(written["layouts"]) == 3 * 7
    assert (written["preset"]["explorers"], written["preset"]["learners"]) == (4, 4)
    assert written["preset"]["seconds"] == next(c["seconds"] for c in written["layouts"]
                                                if (c["explorers"], c["mode"], c["streamed"]) == (4, "sync", True))
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
    """G explorers + G learner ranks sharing G GPUs: both take whole prompt slots, so only G | P is exact."""
    costs = paper_costs("sd35_large")
    assert colocated_actors_s(costs, PAPER_SHAPE, 8) == pytest.approx(427.0)
    # 10 slots on the busiest explorer and the busiest learner rank where 9.6 would balance
    assert colocated_actors_s(costs, PAPER_SHAPE, 5) == pytest.approx(colocated_s(costs, PAPER_SHAPE, 5) * 10 / 9.6)
    # 64 GPUs, 48 slots: one slot each, 16 GPUs idle on both sides: g + one slot's regeneration and training
    assert colocated_actors_s(costs, PAPER_SHAPE, 64) == pytest.approx((125 + 62 + 240) * 8 / 48)


def test_the_plan_says_what_uneven_learner_slots_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plan counts whole slots over learners, and says how they split at the chosen L."""
    result = plan(paper_costs("sd35_large"), PAPER_SHAPE, 8)
    by_split = {(c["explorers"], c["mode"], c["streamed"]): c["learner_slots"] for c in result["layouts"]}
    five = by_split[(3, "sync", True)]  # 48 slots over 5 ranks: 9, 9, 10, 10, 10
    assert (five["busiest"], five["ideal"], five["even_rank_counts"]) == (10, 9.6, (4, 6))
    assert five["idle_share"] == pytest.approx(0.04)
    four = by_split[(4, "sync", True)]
    assert (four["busiest"], four["idle_share"], four["even_rank_counts"]) == (12, 0.0, ())
    main(["--gpus", "8", "--json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert "learner slots of best sync streamed (counted in the seconds above): 48 slots over 4 learner ranks: " \
           "12 each, none idle" in out
    assert ("learner slots of best sync (counted in the seconds above): 48 slots over 5 learner ranks: the busiest "
            "trains 10, the ideal 9.6; 4% of learner time idle each iteration; L = 4 or 6 divides 48 evenly "
            "(ranks 2–4 train 10, ranks 0–1 train 9:") in out
    assert "learner slots of best async (counted in the seconds above): 48 slots over 6 learner ranks: 8 each" in out
    assert "the preset's layout (4E+4L, sync, streamed): 740.3 s (1.73× colocated); its learner slots as above" in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["preset"]["learner_slots"] == {"slots": 48, "ranks": 4, "busiest": 12, "ideal": 12.0,
                                                  "idle_share": 0.0, "even_rank_counts": []}
    main(["--gpus", "8", "--model", "flux_dev"])  # its preset and best sync splits: 4 ranks, 12 slots each
    out = capsys.readouterr().out
    assert "learner slots of best sync, sync streamed (counted in the seconds above): 48 slots over 4 " \
           "learner ranks: 12 each, none idle" in out
    assert "the preset's layout (4E+4L, sync, streamed): 560.6 s (1.78× colocated); its learner slots as above" in out


def test_sd35_large_on_64_gpus_counts_whole_slots() -> None:
    """48 slots over 40 learner ranks: 8 ranks train 2, so the group takes 2 slots' time, not 48/40 = 1.2."""
    costs = paper_costs("sd35_large")
    g, r, t = 125 * 8 / 48, 62 * 8 / 48, 240 * 8 / 48  # one group explored, one slot regenerated, one trained
    assert split_s(costs, PAPER_SHAPE, 24, 40, "async", False) == pytest.approx(max(2 * g, 2 * (r + t)))  # 100.7 s
    result = plan(costs, PAPER_SHAPE, 64)
    best = result["best"]
    assert (best["async"]["explorers"], best["async"]["seconds"]) == (16, pytest.approx(3 * g))  # 62.5 s
    assert best["async"]["learner_idle"] == pytest.approx(1 - 48 * (r + t) / (48 * 3 * g))
    # one slot per rank: its group arrives at the last wave (3·g) on every split that keeps up, so streaming
    # gains nothing over sync
    assert (best["sync"]["explorers"], best["sync"]["seconds"]) == (16, pytest.approx(3 * g + r + t))  # 112.8 s
    assert best["sync_streamed"]["seconds"] == pytest.approx(best["sync"]["seconds"])
    assert result["colocated_s"] == pytest.approx(427 * 8 / 64)  # the paper's layout shards samples: no slots
    assert result["colocated_actors_s"] == pytest.approx(g + r + t)  # 71.2 s: 64 ranks, one slot on the busiest


def whole_slot_bound(costs: Costs, shape: Shape, explorers: int, learners: int, mode: str, streamed: bool,
                     efficiency: float) -> float:
    """No layout can beat its busiest GPUs: ceil(P/E) groups on one explorer, ceil(P/L) slots on one learner
    rank, at L/u(L) of a lone learner's time each. Sync adds the two; streamed regenerates the last group
    after it arrives, on its rank, before any rank trains."""
    d = costs.decode_reward_s_per_image  # every explored and regenerated image decoded and scored once
    g = shape.candidates * (shape.explore_steps * costs.explore_s_per_sample_step + d)
    per_rank = learners / (1 + (learners - 1) * efficiency)
    r = shape.keep * (shape.regen_steps * costs.regen_s_per_sample_step + d) * per_rank
    t = shape.keep * costs.train_s_per_sample * per_rank
    x, busiest = math.ceil(shape.prompts / explorers) * g, math.ceil(shape.prompts / learners)
    extra = costs.sync_s + costs.overhead_s
    if mode == "async":
        return max(x, busiest * (r + t) + costs.sync_s) + costs.overhead_s
    if streamed:
        return max(x + r, busiest * r) + busiest * t + extra
    return x + busiest * (r + t) + extra


def test_the_plan_never_reports_a_layout_faster_than_its_whole_slot_bound() -> None:
    cases = [(paper_costs(m), PAPER_SHAPE, g, e) for m in MODELS for g in (2, 8, 13, 16, 64, 100)
             for e in (1.0, 0.8)] + random_cases(150)
    for costs, shape, gpus, eff in cases:
        result = plan(costs, shape, gpus, eff)
        for c in [*result["layouts"], *result["best"].values()]:
            bound = whole_slot_bound(costs, shape, c["explorers"], c["learners"], c["mode"], c["streamed"], eff)
            assert c["seconds"] >= bound * (1 - 1e-12), (gpus, c)
            if c["mode"] == "async" or not c["streamed"]:  # there the bound is the model
                assert c["seconds"] == pytest.approx(bound, rel=1e-12)
        for key, c in result["best"].items():
            mode, streamed = ("async", False) if key == "async" else ("sync", key == "sync_streamed")
            assert c["seconds"] == min(o["seconds"] for o in result["layouts"]
                                       if (o["mode"], o["streamed"]) == (mode, streamed))


def test_the_async_optimum_need_not_sit_where_the_sides_cross() -> None:
    """At e < 1 more learner ranks with the same busiest rank's slots are slower, so the learners' side is not
    monotone in L and the optimizer tries every split. 48 slots over 13–15 ranks: 4 on the busiest each."""
    costs, eff = paper_costs("sd35_large"), 0.5
    learner_side = [split_s(costs, PAPER_SHAPE, 40 - n, n, "async", False, eff) for n in (13, 14, 15)]
    assert learner_side[0] < learner_side[1] < learner_side[2]
    for gpus in range(2, 65):
        brute = min(all_layouts(costs, PAPER_SHAPE, gpus, eff)[2 * (gpus - 1):], key=lambda c: (c.seconds, c.explorers))
        assert best_split(costs, PAPER_SHAPE, gpus, "async", False, eff) == brute


def test_scored_images_are_priced_so_halving_and_pool_size_change_the_explore_phase() -> None:
    """g = (sample-steps)·c_x + (scored images)·d: successive halving scores N + M images for N·f + M·(S − f)
    steps (`learner.rollouts.successive_halving`), a smaller pool fewer."""
    costs = Costs(explore_s_per_sample_step=1.0, regen_s_per_sample_step=2.0, train_s_per_sample=3.0,
                  decode_reward_s_per_image=10.0)
    assert work(costs, SMALL) == (4 * 2 * (1 + 10), 4 * 1 * (2 + 10), 12.0)
    halving = replace(PAPER_SHAPE, halving=(2, 48))
    assert (halving.explore_sample_steps(), halving.explore_scored()) == (96 * 2 + 48 * 4, 96 + 48)
    assert work(costs, halving)[0] == 48 * ((96 * 2 + 48 * 4) * 1.0 + 144 * 10.0)
    assert work(costs, replace(PAPER_SHAPE, candidates=48))[0] == 48 * 48 * (6 + 10)
    paper = paper_costs("sd35_large")
    ratio = work(paper, halving)[0] / work(paper, PAPER_SHAPE)[0]
    assert ratio == pytest.approx(0.892, abs=1e-3)  # 0.667 in steps alone; the cut's 96 scorings are paid
    assert work(paper_costs("sd35_large", d=0.0), halving)[0] / work(paper, PAPER_SHAPE)[0] == pytest.approx(2 / 3)
    assert split_s(paper, halving, 2, 6, "async", False) < split_s(paper, PAPER_SHAPE, 2, 6, "async", False)


def test_a_costs_file_without_d_keeps_d_0_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text(json.dumps(
        {"explore_s_per_sample_step": 0.0362, "regen_s_per_sample_step": 0.0431, "train_s_per_sample": 1.667}))
    main(["--gpus", "8", "--costs", str(tmp_path / "run.json"), "--json", str(tmp_path / "plan.json")])
    out = capsys.readouterr().out
    assert out.count("decode + reward per image d = 0 (no decode_reward_s_per_image in the costs file)") == 1
    assert json.loads((tmp_path / "plan.json").read_text())["costs"]["decode_reward_s_per_image"] == 0.0
    (tmp_path / "measured.json").write_text(json.dumps(
        {"explore_s_per_sample_step": 0.0362, "regen_s_per_sample_step": 0.0431, "train_s_per_sample": 1.667,
         "decode_reward_s_per_image": 0.05}))
    main(["--gpus", "8", "--costs", str(tmp_path / "measured.json"), "--json", str(tmp_path / "plan.json")])
    assert "d = 0" not in capsys.readouterr().out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["colocated_s"] == pytest.approx(48 * (96 * (6 * 0.0362 + 0.05) + 24 * (10 * 0.0431 + 0.05)
                                                         + 24 * 1.667) / 8)
    main(["--gpus", "8"])
    assert "d 0.05857/image (decode + reward" in capsys.readouterr().out
