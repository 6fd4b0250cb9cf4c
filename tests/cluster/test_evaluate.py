"""`python -m cluster.evaluate`: the in-loop protocol from outside the run. On a tiny embedded run it gives the
run's own logged numbers exactly — its last evaluation for the run directory (the checkpoint's EMA through the
adapters), base_eval.json for the embedded base — and a LoRA merged into the base lands within rounding of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tiny import tiny_config

from cluster.evaluate import main as evaluate_main
from learner.trainer import Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A 2-iteration tiny embedded run, evaluated before training and after each iteration, as a launch leaves
    it (config.yaml, base_eval.json, metrics.jsonl, checkpoint/, final/)."""
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    config = tiny_config("run.iterations=2", "eval.every=1", "training.lr=0.01", "cluster.learner.threads=1")
    trainer = Trainer(config, run_dir)
    trainer.evaluate_base()
    trainer.run(log=lambda _: None)
    trainer.save_final(run_dir / "final")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return run_dir


def results(out: Path) -> list[dict]:
    return [model["metrics"] for model in json.loads((out / "results.json").read_text())["models"]]


def logged(run_dir: Path) -> tuple[dict, dict]:
    base = json.loads((run_dir / "base_eval.json").read_text())
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    return base, {k: v for k, v in last.items() if k in base}


def test_a_run_and_the_embedded_base_give_exactly_the_numbers_the_run_logged(run, tmp_path, capsys):
    base, last = logged(run)
    assert base != last  # training moved the held-out reward
    out = tmp_path / "compare"
    assert evaluate_main(["--compare", "embedded", str(run), "--out", str(out)]) == 0
    assert results(out) == [base, last]
    table = (out / "results.md").read_text()
    assert table.startswith(f"| metric | embedded | {run} |") and f"| {last['eval_reward']:.4f} |" in table
    assert (out / "samples.png").is_file() and "prompt 2/2" in capsys.readouterr().out
    # a run's final/ names the run: the same policy, evaluated as the run did
    assert evaluate_main(["--model", str(run / "final"), "--out", str(tmp_path / "final")]) == 0
    assert results(tmp_path / "final") == [last]


def test_a_lora_merged_into_the_base_scores_within_rounding_of_the_run(run, tmp_path):
    _, last = logged(run)
    out = tmp_path / "lora"
    assert evaluate_main(["--model", "embedded", "--lora", str(run / "final" / "lora"), "--config",
                          str(run / "config.yaml"), "--out", str(out)]) == 0
    described = json.loads((out / "results.json").read_text())["models"][0]
    assert described["lora_scale"] == 2.0  # α / r of the tiny config, from the file's metadata
    for name, value in last.items():
        assert results(out)[0][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name


def test_bad_input_is_one_line_before_any_model_loads(run, tmp_path, capsys):
    assert evaluate_main(["--model", str(run), "--lora", "x", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --lora with a run ({run}): a run's own adapter is "
                                               "evaluated; drop --lora")
    assert evaluate_main(["--model", str(run), "--checkpoint", "9", "--out", str(tmp_path)]) == 2
    assert "error: --checkpoint 9: " in capsys.readouterr().err


def test_an_export_of_the_run_evaluates_as_a_model_folder(run, tmp_path):
    """The exported pipeline folder (the EMA merged into the transformer) is a model like any other."""
    from cluster.export import main as export_main

    _, last = logged(run)
    export_main(["--run-dir", str(run), "--out", str(tmp_path / "export")])
    out = tmp_path / "evaluated"
    assert evaluate_main(["--model", str(tmp_path / "export"), "--config", str(run / "config.yaml"),
                          "--out", str(out)]) == 0
    for name, value in last.items():
        assert results(out)[0][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
