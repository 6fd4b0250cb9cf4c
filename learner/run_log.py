"""The run's log: metrics.jsonl (one JSON record per iteration) and the one-line progress report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from diffusion.progress import Progress


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
    parts = [head, f"reward {m['reward_mean']:7.3f}"]
    if "eval_reward" in m:
        parts.append(f"held-out {m['eval_reward']:7.3f}" + (f" acc {m['eval_accuracy']:.3f}" if "eval_accuracy" in m
                                                             else ""))
    if "rank_spearman" in m and not math.isnan(m["rank_spearman"]):
        parts.append(f"ρ {m['rank_spearman']:.2f}")
    regen = m["rollout_s"] + m.get("streamed_rollout_s", 0.0)  # streamed: overlapped with exploration
    timing = (f"explore {m['explore_s']:.1f}s regen {regen:.1f}s" + (" (streamed)" if m.get("streamed_slots") else "")
              if "explore_s" in m else f"rollout {m['rollout_s']:.1f}s")
    parts.append(f"{timing} train {m['train_s']:.1f}s sync {m.get('sync_s', 0.0):.2f}s")
    if m.get("dropped_micro_batches"):
        parts.append(f"dropped {m['dropped_micro_batches']} micro-batch(es)")
    if m.get("skipped"):
        parts.append("SKIPPED")
    return "  ".join(parts)
