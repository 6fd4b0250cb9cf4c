"""The run's log: its one writer (`RunLog`), metrics.jsonl's format and the one-line progress report.

Whoever drives the loop (the Ray driver, or the single-process `Trainer.run`) completes each
iteration's `IterationRecord` and hands it to `RunLog.write`, the only code that writes metrics.jsonl,
base_eval.json, the experiment log (W&B / TensorBoard) and, in a Ray job, the dashboard's gauges: the
same record reaches every one of them, complete.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from diffusion.progress import Progress
from learner.config import TrainerConfig
from learner.experiment_log import ExperimentLog, GridSamples
from learner.iteration_record import IterationRecord

METRICS_FILE = "metrics.jsonl"
BASE_EVAL_FILE = "base_eval.json"
SUMMARY_FILE = "summary.json"


class Gauges(Protocol):
    """The dashboard's series of the run (`actors.metrics.LearnerMetrics` in a Ray job)."""

    def record(self, values: dict[str, Any]) -> None: ...


def read_base_evaluation(run_dir: Path) -> dict[str, float]:
    """The base model's held-out evaluation of the run in `run_dir` ({} when it was not evaluated)."""
    path = run_dir / BASE_EVAL_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    """summary.json: what the whole run left (its caller decides the fields), written whole or not at all."""
    path, tmp = run_dir / SUMMARY_FILE, run_dir / (SUMMARY_FILE + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)
    return path


class RunLog:
    """The run's records from iteration `start` on: metrics.jsonl is cut to the iterations before `start`
    (what a checkpoint at `start` covers; later lines are redone), and `history` holds every record of
    the run. Without a run directory only `history` and the gauges are kept."""

    def __init__(self, run_dir: Path | None, config: TrainerConfig, *, start: int = 0,
                 gauges: Gauges | None = None) -> None:
        self.run_dir, self.total, self.gauges = run_dir, config.run.iterations, gauges
        self.history: list[dict[str, Any]] = []
        self.base: dict[str, float] = {}
        self.experiment: ExperimentLog | None = None
        if run_dir is not None:
            self.history = truncate_metrics(run_dir / METRICS_FILE, start)
            self.base = read_base_evaluation(run_dir)
            self.experiment = ExperimentLog.open(config.logging, run_dir, run_dir.name, config.model_dump(mode="json"))

    def skipped_updates(self) -> int:
        """Updates the run has skipped so far (the last record's count: a resumed run continues it)."""
        return int(self.history[-1].get("skipped_updates", 0)) if self.history else 0

    def write_base(self, evaluation: dict[str, float], grid: GridSamples | None) -> None:
        """The base model's evaluation: base_eval.json (kept for resumed runs) and the experiment log's step 0."""
        self.base = dict(evaluation)
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / BASE_EVAL_FILE).write_text(json.dumps(self.base) + "\n")
        if self.experiment is not None:
            self.experiment.log(0, self.base, grid)

    def write(self, record: IterationRecord) -> dict[str, Any]:
        """One finished iteration, to every destination; its metrics.jsonl row. After the run's last
        iteration the experiment log closes."""
        row = record.row()
        self.history.append(row)
        if self.run_dir is not None:
            append_metrics(self.run_dir / METRICS_FILE, row)
        if self.gauges is not None:
            self.gauges.record(row)
        if self.experiment is not None:
            step = record.iteration + 1
            self.experiment.log(step, row, record.finished.grid)
            if step >= self.total:
                self.close()
        return row

    def close(self) -> None:
        if self.experiment is not None:
            self.experiment.close()
            self.experiment = None


def append_metrics(path: Path, metrics: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(metrics) + "\n")


def truncate_metrics(path: Path, iteration: int) -> list[dict[str, Any]]:
    """Keep the metrics of iterations before `iteration` (what a checkpoint at `iteration` covers):
    the file is rewritten atomically; returns the kept records. A torn last line (a crash mid-write)
    is dropped."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("iteration", iteration) < iteration:
            kept.append(record)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
    return kept


def progress_line(m: dict[str, Any], progress: Progress | None = None) -> str:
    """One iteration's line; with `progress`, it starts with the run's progress and ETA instead of the index."""
    head = progress.line(m["iteration"] + 1) if progress is not None else f"iter {m['iteration']:3d}"
    # the kept samples' mean: best and worst of each pool under best_worst selection, so flat by construction;
    # the held-out reward is the one that shows learning
    parts = [head, f"kept reward {m['reward_mean']:7.3f}"]
    if "eval_reward" in m:
        parts.append(f"held-out {m['eval_reward']:7.3f}" + (f" acc {m['eval_accuracy']:.3f}" if "eval_accuracy" in m
                                                             else ""))
    if "rank_spearman" in m and not math.isnan(m["rank_spearman"]):
        parts.append(f"ρ {m['rank_spearman']:.2f}")
    regen = m["rollout_s"] + m.get("streamed_rollout_s", 0.0)  # streamed: overlapped with exploration
    timing = (f"explore {m['explore_s']:.1f}s regen {regen:.1f}s" + (" (streamed)" if m.get("streamed_slots") else "")
              if "explore_s" in m else f"rollout {m['rollout_s']:.1f}s")
    parts.append(f"{timing} train {m['train_s']:.1f}s sync {m.get('sync_s', 0.0):.2f}s")
    ratio = m.get("explore_regen_step_ratio")
    if ratio is not None:
        parts.append(f"step lp/fp {ratio:.2f}" + (" WARNING: a low-precision step costs more than a full-precision "
                                                   "one, exploration saves nothing (docs/gpu.md)" if ratio > 1 else ""))
    if m.get("dropped_micro_batches"):
        parts.append(f"dropped {m['dropped_micro_batches']} micro-batch(es)")
    if m.get("skipped"):
        parts.append("SKIPPED")
    return "  ".join(parts)
