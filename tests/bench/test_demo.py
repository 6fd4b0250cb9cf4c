"""`make demo`'s command at a tiny scale: it trains, evaluates and leaves its files behind."""

from __future__ import annotations

import json

from tiny import tiny_sets

from bench.demo import main

SMALL = tiny_sets("prompts.candidates=16", "eval.every=1", ray=True)


def test_demo_runs_end_to_end(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    main(["--run-dir", str(run_dir), "--iterations", "2", "--fidelity-prompts", "1",
          *[arg for item in SMALL for arg in ("--set", item)]])
    out = capsys.readouterr().out
    assert "iteration 2/2 (100%)" in out and "held-out reward" in out and "| nvfp4 | 3 |" not in out
    for name in ("samples_before_after.png", "reward_curve.png", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).stat().st_size > 0, name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 2 and set(summary["rank_fidelity"]) == {"reference", "none_explore_steps", "nvfp4"}
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0, 1]
    assert (run_dir / "checkpoint" / "meta.json").is_file()
