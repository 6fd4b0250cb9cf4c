"""bench.adaptive_explore's schedules and table: the spread rows beside the fixed pass and halving, and a
results file written before the spread rows (no selected gap) still formats."""

from __future__ import annotations

from bench.adaptive_explore import format_table, parse_schedule
from learner.rollouts import Sampling

FIXED = Sampling(6, "euler")


def test_each_schedule_parses_to_its_sampling_or_says_why_not() -> None:
    assert parse_schedule("6", FIXED, 24, 96) == (FIXED, 96)
    assert parse_schedule("3:48", FIXED, 24, 96)[0].halving == (3, 48)
    spread, given = parse_schedule("spread:48", FIXED, 24, 96)
    assert (spread.spread, spread.spread_rule, given) == (48, "median", 96)
    assert parse_schedule("proportional:36", FIXED, 24, 96)[0].spread_rule == "proportional"
    assert parse_schedule("pool:72", FIXED, 24, 96) == (FIXED, 72)
    assert parse_schedule("spread:96", FIXED, 24, 96) == "spread:F needs 24 <= F < 96"
    assert parse_schedule("pool:12", FIXED, 24, 96) == "pool:M needs 24 <= M <= 96"
    assert parse_schedule("6:48", FIXED, 24, 96) == "f:M needs f < 6 explore steps and 24 <= M <= 96"


def test_the_table_labels_every_schedule_and_tolerates_results_without_a_gap() -> None:
    row = {"precision": 0.5, "contrast": 0.75, "gap": 12.5, "steps": 432.0}
    table = format_table({"6": {**row, "steps": 576.0}, "3:48": row, "spread:48": {**row, "pool": 72.0},
                          "proportional:48": row, "pool:72": row, "2:36": {k: v for k, v in row.items() if k != "gap"}},
                         576)
    lines = table.splitlines()
    assert lines[0].startswith("| schedule | precision | contrast | selected gap (reward) |")
    assert lines[2] == "| fixed, 6 steps | 0.500 | 0.750 | 12.500 | 576 | 1.00 |"
    assert lines[3].startswith("| halving: all 3 steps, 48 finish |")
    assert lines[4] == ("| spread: 48 for all, the rest where their std ≥ the median | 0.500 | 0.750 | 12.500 | 432 "
                        "| 0.75 |")
    assert lines[5].startswith("| spread: 48 for all, up to all in proportion to their std |")
    assert lines[6].startswith("| fixed, first 72 seeds only |")
    assert lines[7] == "| halving: all 2 steps, 36 finish | 0.500 | 0.750 | — | 432 | 0.75 |"
