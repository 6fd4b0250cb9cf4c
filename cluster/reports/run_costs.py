"""A run's measured per-phase costs, in the format `python -m bench.plan --costs FILE` reads.

    explore_s_per_sample_step = Σ explorers' sampling seconds / Σ (candidates explored (P · N) · explore steps)
    regen_s_per_sample_step   = Σ learner's regeneration seconds (streamed or not) / Σ regenerated sample-steps
    train_s_per_sample        = Σ learner's update seconds / Σ (P · K)

Seconds are device-seconds of one actor (one GPU each on a real cluster), summed over the iterations after the
first (start-up and first touches), or over the only one. Written to `costs.json` in the run directory.
"""

from __future__ import annotations

from typing import Any

from cluster.config.schema import SolRLConfig


def measured_costs(config: SolRLConfig, history: list[dict[str, Any]]) -> dict[str, float] | None:
    """The costs of the iterations in `history` (None when they hold no explorer measurements)."""
    steady = [m for m in history[1:] if "explore_busy_s" in m] or [m for m in history if "explore_busy_s" in m]
    if not steady:
        return None
    p = config.prompts
    # the candidates of every group explored (in async mode, stale groups explored again count twice)
    explored = sum(m.get("explored_candidates", p.per_iteration * p.candidates) for m in steady) * config.explore.steps
    regenerated = sum(m.get("fp_sample_steps", 0) for m in steady)
    trained = len(steady) * p.per_iteration * p.keep
    regen_s = sum(m.get("rollout_s", 0.0) + m.get("streamed_rollout_s", 0.0) for m in steady)
    return {"explore_s_per_sample_step": sum(m["explore_busy_s"] for m in steady) / explored,
            "regen_s_per_sample_step": regen_s / max(regenerated, 1),
            "train_s_per_sample": sum(m["train_s"] for m in steady) / trained,
            "sync_s": sum(m.get("sync_s", 0.0) for m in steady) / len(steady)}
