"""Dashboard metrics (`ray.util.metrics`), named solrl_<the metrics.jsonl key>: they appear on each
node's Prometheus port as ray_solrl_* and in the Ray dashboard's metrics view."""

from __future__ import annotations

import math
from typing import Any

from ray.util.metrics import Counter, Gauge

_LEARNER_GAUGES = {
    "reward_mean": "mean true reward of the kept samples",
    "reward_max": "max true reward of the kept samples",
    "proxy_reward_mean": "mean low-precision (proxy) reward of the explored candidates",
    "eval_reward": "held-out reward (full precision)",
    "rank_spearman": "Spearman rho of proxy vs true reward on the kept seeds",
    "selection_precision": "share of kept seeds on the right side of the true median",
    "explore_s": "slowest explorer's seconds for this iteration's slots",
    "rollout_s": "learner's sampling seconds (regeneration, and any pool it samples itself)",
    "train_s": "learner's update seconds",
    "sync_s": "learner's publish seconds",
    "policy_version": "newest policy version",
    "policy_lag": "learner version minus the version a group was explored with (max)",
    "learner_idle_fraction": "share of the iteration the learner waited for explorers",
    "candidates_per_second": "explored candidates per second, all explorers",
    "explorers": "explorer actors taking slots (cluster.control changes it while the job runs)",
    "explorers_joining": "explorer actors still loading, joining at the next iteration",
}


class LearnerMetrics:
    def __init__(self) -> None:
        self.gauges = {k: Gauge(f"solrl_{k}", description=d) for k, d in _LEARNER_GAUGES.items()}
        self.skipped = Counter("solrl_skipped_updates", description="updates skipped (NaN/inf reward or loss)")
        self.dropped_micro_batches = Counter("solrl_dropped_micro_batches",
                                             description="micro-batches dropped for a NaN/inf loss")
        self.dropped = Counter("solrl_dropped_groups", description="ranked groups dropped as too stale")
        self.retries = Counter("solrl_explorer_retries", description="slots re-sent after their explorer died")
        self.deaths = Counter("solrl_explorer_deaths", description="explorer deaths seen by the driver")

    def record(self, values: dict[str, Any]) -> None:
        for key in values:  # each configured reward's component, named after it
            if key.startswith("reward_") and key not in self.gauges:
                self.gauges[key] = Gauge(f"solrl_{key}", description=f"mean {key[7:]} reward of the kept samples "
                                         "(before weighting)")
        for key, gauge in self.gauges.items():
            value = values.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                gauge.set(float(value))
        if values.get("skipped"):
            self.skipped.inc()
        for counter, key in ((self.dropped, "dropped_groups"), (self.retries, "explorer_retries"),
                             (self.deaths, "explorer_deaths"), (self.dropped_micro_batches, "dropped_micro_batches")):
            if values.get(key):
                counter.inc(float(values[key]))


class ExplorerMetrics:
    def __init__(self) -> None:
        self.candidates = Counter("solrl_explored_candidates", description="candidates explored")
        self.syncs = Counter("solrl_weight_syncs", description="snapshots loaded by explorers")
        self.sync_seconds = Gauge("solrl_explorer_sync_seconds", description="fetch + load seconds of a snapshot")

    def explored(self, group) -> None:
        self.candidates.inc(float(len(group.seeds)))

    def synced(self, info: dict[str, float]) -> None:
        self.syncs.inc()
        self.sync_seconds.set(info["fetch_s"] + info["load_s"])
