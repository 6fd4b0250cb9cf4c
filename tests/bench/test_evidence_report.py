"""The evidence report: per-run files merged into the paper's tables, with targets never reached shown as such."""

from __future__ import annotations

import json
import math

import pytest

from bench.convergence import add_modeled_cost
from bench.evidence import PLAN, command, pending
from bench.evidence_report import equal_time_table, report, splice, spread


def points(rewards: list[float], fp: int, lp: int = 0, pool: int = 0) -> list[dict]:
    """One evaluation per iteration, counters cumulative as `bench.convergence.run_one` records them."""
    return [{"iteration": i, "wall_s": float(i), "rollout_s": 0.0, "train_s": float(i), "fp_sample_steps": i * fp,
             "fp_pool_sample_steps": i * pool, "lp_sample_steps": i * lp, "train_passes": i * 5760,
             "eval_reward": r, "eval_accuracy": 0.5, "eval_digit_alignment": -1.0} for i, r in enumerate(rewards)]


def write(run_dir, name: str, seed: int, rewards: list[float], **counts) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"{name}_seed{seed}.json").write_text(
        json.dumps({"args": {}, "runs": {name: {str(seed): points(rewards, **counts)}}}))


def test_equal_time_rewards_are_interpolated_at_the_cheapest_runs_final_budget() -> None:
    runs = {"diffusionnft": {0: points([0.0, 1.0, 2.0, 3.0], fp=100)},
            "sol_rl": {0: points([0.0, 2.0, 4.0, 6.0], fp=100, lp=200)},  # dearer per iteration
            "flow_grpo": {0: points([0.0, 0.5, 1.0, 1.5], fp=100)}}
    add_modeled_cost(runs)
    _, table = equal_time_table(runs)
    budget = runs["diffusionnft"][0][-1]["modeled_s"]  # the cheapest final: diffusionnft's 3 iterations
    assert table["budget_s"][0] == budget
    per_iteration = runs["sol_rl"][0][1]["modeled_s"]
    assert table["reward"]["sol_rl"] == [pytest.approx(2.0 * budget / per_iteration)]
    assert table["reward"]["diffusionnft"] == [3.0] and table["reward"]["flow_grpo"] == [1.5]


def test_spread_keeps_per_seed_values_and_names_targets_never_reached() -> None:
    assert spread([1.0, 3.0, math.inf], 1) == "2.0 (1.0–3.0) [1.0, 3.0, never]"
    assert spread([math.nan], 2) == "never [never]"


def test_report_builds_every_table_from_per_run_files(tmp_path) -> None:
    runs, results, doc = tmp_path / "runs", tmp_path / "results", tmp_path / "evidence.md"
    discussion = tmp_path / "benchmarks.md"
    discussion.write_text("# Benchmarks\n\nprose\n<!-- evidence:begin -->\nstale\n<!-- evidence:end -->\nmore prose\n")
    for seed in (0, 1):
        write(runs, "diffusionnft", seed, [0.0, 1.0, 2.0], fp=100)
        write(runs, "sol_rl", seed, [0.0, 2.0, 4.0], fp=100, lp=10)
        write(runs, "flow_grpo", seed, [0.0, 0.1, 0.2], fp=100)  # never reaches diffusionnft's 2.0
    report(runs, results, doc, discussion)
    numbers = json.loads((results / "evidence.json").read_text())["tables"]
    assert numbers["convergence"]["sol_rl"]["iteration"]["per_seed"] == [pytest.approx(2.0)] * 2
    assert numbers["convergence"]["flow_grpo"]["iteration"]["per_seed"] == [0.0, 0.0]
    text = doc.read_text()
    assert "| flow_grpo | 2 | 0.200 (0.200–0.200) [0.200, 0.200] |" in text
    assert "never [never, never]" in text
    assert numbers["table2"]["sol_rl"]["final"] == [4.0, 4.0]  # 6 explore steps: the default sol_rl run
    assert (results / "evidence_algorithms.png").stat().st_size > 0
    spliced = discussion.read_text()
    assert spliced.startswith("# Benchmarks\n\nprose\n") and spliced.endswith("<!-- evidence:end -->\nmore prose\n")
    assert "stale" not in spliced and "#### Table 1" in spliced and "never [never, never]" in spliced
    assert "Runs in this report" not in spliced  # the inventory stays in the generated file
    report(runs, results, doc, discussion)
    assert discussion.read_text() == spliced  # a second report replaces the tables, nothing piles up


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
    assert command(*first)[-1] == f"bench/results/runs/{first[0]}_seed{first[1]}.json"
