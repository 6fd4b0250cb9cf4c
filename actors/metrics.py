"""Dashboard metrics (`ray.util.metrics`): every series the job exports, declared once in `METRICS`.

Each node's Prometheus endpoint shows them as `ray_<name>` (counters as `ray_<name>_total`); Ray adds the
labels `NodeAddress` (the node) and `SessionName`, the job adds `run` (the run directory's name, so two
jobs on one cluster stay apart) and, on per-actor series, `explorer` / `scorer` (the actor's index, as in
its name `solrl-explorer-<i>`). `cluster.monitoring.grafana` builds the Grafana dashboard from this table, so a panel
can only query a declared metric, and each panel takes its unit from here.

An explorer's own counters are per process (Ray's `WorkerId` label): a dying process's series keeps what it had
reported and loses what it counted after its last report, so their sum can undercount the job.
The job's totals (`solrl_job_*`) are the driver's: it counts what every ranked group reports.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from ray.util.metrics import Counter, Gauge

# Grafana unit ids (panel `unit`) and the word each adds to the metric's description.
UNITS = {"none": "", "s": "seconds", "percentunit": "fraction 0-1", "bytes": "bytes", "short": "count",
         "cps": "per second", "Bps": "bytes per second"}


@dataclass(frozen=True)
class Metric:
    name: str  # without Ray's `ray_` prefix
    kind: Literal["gauge", "counter"]
    unit: str  # a key of UNITS
    description: str
    key: str | None = None  # the metrics.jsonl key it mirrors (learner metrics)
    tags: tuple[str, ...] = ("run",)

    @property
    def series(self) -> str:
        """The name Prometheus shows (Ray prefixes `ray_`, Prometheus counters end in `_total`)."""
        return f"ray_{self.name}" + ("_total" if self.kind == "counter" else "")

    @property
    def help(self) -> str:
        return f"{self.description} [{UNITS[self.unit]}]" if UNITS[self.unit] else self.description

    def instrument(self, default_tags: dict[str, str]) -> Gauge | Counter:
        make = Gauge if self.kind == "gauge" else Counter
        metric = make(self.name, description=self.help, tag_keys=self.tags)
        metric.set_default_tags({k: v for k, v in default_tags.items() if k in self.tags})
        if self.kind == "counter" and set(self.tags) <= set(default_tags):
            # Exported at 0 from the start (Prometheus' advice: `increase()` then sees the first event);
            # Ray's Counter.inc refuses 0, so record it directly.
            metric._record(0.0)
        return metric


def _gauge(key: str, unit: str, description: str, name: str | None = None, tags: tuple[str, ...] = ("run",)) -> Metric:
    return Metric(name or f"solrl_{key}", "gauge", unit, description, key=key, tags=tags)


def _counter(key: str | None, name: str, description: str, unit: str = "short",
             tags: tuple[str, ...] = ("run",)) -> Metric:
    return Metric(name, "counter", unit, description, key=key, tags=tags)


LEARNER = (
    Metric("solrl_iterations_done", "gauge", "short", "iterations finished"),
    _gauge("iterations_planned", "short", "iterations the run is to finish (run.iterations)"),
    _gauge("reward_mean", "none", "mean true (full-precision) reward of the kept samples"),
    _gauge("reward_max", "none", "max true reward of the kept samples"),
    _gauge("proxy_reward_mean", "none", "mean low-precision (proxy) reward of the explored candidates"),
    _gauge("eval_reward", "none", "held-out reward (full precision), every eval.every iterations"),
    _gauge("rank_spearman", "none", "Spearman rho of proxy vs true reward on the kept seeds"),
    _gauge("selection_precision", "percentunit", "share of kept seeds on the right side of the true median"),
    _gauge("explore_s", "s", "slowest explorer's seconds for this iteration's slots", "solrl_explore_seconds"),
    _gauge("rollout_s", "s", "learner's regeneration seconds not overlapped with exploration",
           "solrl_regenerate_seconds"),
    _gauge("streamed_rollout_s", "s", "learner's regeneration seconds overlapped with exploration (streamed)",
           "solrl_regenerate_streamed_seconds"),
    _gauge("train_s", "s", "learner's update seconds", "solrl_train_seconds"),
    _gauge("explore_step_s", "s", "explore engine's seconds per denoising step of one candidate",
           "solrl_explore_step_seconds"),
    _gauge("regen_step_s", "s", "learner's full-precision seconds per denoising step of one sample",
           "solrl_regenerate_step_seconds"),
    _gauge("explore_regen_step_ratio", "none", "explore step price over regeneration step price (Sol-RL gains "
           "while below 1; the paper's Blackwell FP4: 0.46)"),
    _gauge("sync_s", "s", "learner's publish seconds (encode + send to every node)", "solrl_sync_seconds"),
    _gauge("iteration_s", "s", "learner's seconds for the iteration (regenerate + train)", "solrl_iteration_seconds"),
    _gauge("policy_version", "short", "newest policy version"),
    _gauge("policy_lag", "short", "learner version minus the version a group was explored with (max)"),
    _gauge("learner_idle_fraction", "percentunit", "share of the iteration the learner waited for explorers"),
    _gauge("candidates_per_second", "cps", "explored candidates per second, all explorers"),
    _gauge("explorers", "short", "explorer actors taking slots (cluster.control changes it while the job runs)"),
    _gauge("explorers_joining", "short", "explorer actors still loading, joining at the next iteration"),
    _counter("skipped", "solrl_skipped_updates", "updates skipped (NaN/inf reward or loss)"),
    _counter("dropped_micro_batches", "solrl_dropped_micro_batches", "micro-batches dropped for a NaN/inf loss"),
    _counter("dropped_groups", "solrl_dropped_groups", "ranked groups dropped as too stale (async)"),
    _counter("explorer_retries", "solrl_explorer_retries", "slots re-dispatched after their explorer died"),
    _counter("explorer_deaths", "solrl_explorer_deaths", "explorer deaths seen by the driver"),
    _counter("sync_bytes", "solrl_weight_sync_bytes", "bytes of weights published to the nodes' sync services",
             unit="bytes"),
    _counter("explorers_lost", "solrl_explorers_lost", "explorers removed after cluster.explorers.lost_after_s "
             "unreachable (their node left, no room elsewhere)"),
    # The job's exploration totals, counted by the driver from the ranked groups: whole across explorer restarts.
    _counter("explored_candidates", "solrl_job_explored_candidates", "candidates explored, all explorers "
             "(the driver's count of the groups that arrived)"),
    _counter("explore_busy_s", "solrl_job_explorer_busy_seconds", "seconds all explorers spent exploring "
             "(sampling + scoring; the driver's count)", unit="s"),
    _counter("explorer_syncs", "solrl_job_weight_syncs", "snapshots loaded, all explorers (the driver's count)"),
    _counter("explorer_sync_s", "solrl_job_explorer_sync_seconds", "seconds all explorers spent fetching and "
             "loading snapshots (the driver's count)", unit="s"),
)
# Per-reward series: metrics.jsonl keys `reward_<name>` and `eval_<name>` become one labelled series each.
REWARD_COMPONENT = Metric("solrl_reward_component", "gauge", "none",
                          "mean reward of the kept samples per configured reward, before weighting",
                          tags=("run", "reward"))
EVAL_DETAIL = Metric("solrl_eval_detail", "gauge", "none",
                     "held-out mean of each reward detail (accuracy, log p, components)", tags=("run", "detail"))
# Per explorer process, for per-explorer rates: a dying process's unreported tail is lost (its restart starts a
# series of its own), so a sum of these can undercount the job; its totals are the driver's `solrl_job_*`.
EXPLORER = (
    _counter(None, "solrl_explored_candidates", "candidates explored by this explorer process",
             tags=("run", "explorer")),
    _counter(None, "solrl_explorer_busy_seconds", "seconds spent exploring (sampling + scoring)", unit="s",
             tags=("run", "explorer")),
    _counter(None, "solrl_weight_syncs", "snapshots loaded by this explorer process", tags=("run", "explorer")),
    _counter(None, "solrl_explorer_sync_seconds", "seconds spent fetching and loading snapshots", unit="s",
             tags=("run", "explorer")),
    _gauge("explorer_policy_version", "short", "policy version the explorer's engine holds",
           tags=("run", "explorer")),
)
# Counters only: a scorer works in bursts, and Ray stops exporting a gauge that is not set again, so a
# "latest batch" gauge is missing from most scrapes. Rates of counters give the same figures over any window
# (images per batch = rate(images) / rate(batches)).
SCORER = (
    _counter(None, "solrl_scorer_requests", "scoring requests served", tags=("run", "scorer")),
    _counter(None, "solrl_scorer_batches", "batches scored (requests merged up to cluster.scorers.max_batch)",
             tags=("run", "scorer")),
    _counter(None, "solrl_scorer_images", "images scored", tags=("run", "scorer")),
    _counter(None, "solrl_scorer_busy_seconds", "seconds spent scoring batches", unit="s", tags=("run", "scorer")),
)
METRICS = (*LEARNER, REWARD_COMPONENT, EVAL_DETAIL, *EXPLORER, *SCORER)
# metrics.jsonl keys starting with reward_ that are not components
_NOT_COMPONENTS = {"reward_mean", "reward_max"}


def by_name(name: str) -> Metric:
    for metric in METRICS:
        if metric.name == name:
            return metric
    raise KeyError(f"no metric {name!r} is declared in actors.metrics.METRICS")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class KeptGauges:
    """Gauges that stay on the endpoint between their sets.

    Ray 2.60 drops a gauge two report intervals (20 s by default) after its last `set`
    (`ray/_private/telemetry/open_telemetry_metric_recorder.py`): a value set once per iteration — minutes on
    a real model — would show on the dashboard for its first 20 s only. Each gauge's last value per label set
    is set again from a daemon thread every half report interval (`RAY_metrics_report_interval_ms`)."""

    def __init__(self) -> None:
        interval_ms = os.environ.get("RAY_metrics_report_interval_ms", "10000")  # noqa: SIM112 (Ray's spelling)
        self.every_s = float(interval_ms) / 2000.0
        self.last: dict[tuple[int, tuple[tuple[str, str], ...]], tuple[Gauge, float, dict[str, str] | None]] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def set(self, gauge: Gauge, value: float, tags: dict[str, str] | None = None) -> None:
        gauge.set(value, tags=tags)
        with self.lock:
            self.last[(id(gauge), tuple(sorted((tags or {}).items())))] = (gauge, value, tags)
            if self.thread is None:
                self.thread = threading.Thread(target=KeptGauges._keep, args=(weakref.ref(self), self.every_s),
                                               name="kept-gauges", daemon=True)
                self.thread.start()

    def close(self) -> None:
        """Keep nothing more: the gauges age out of the endpoint after Ray's TTL."""
        with self.lock:
            self.last.clear()

    @staticmethod
    def _keep(keeper_ref: weakref.ref, every_s: float) -> None:
        """Set every kept gauge again, until its keeper is gone (the thread holds no reference to it)."""
        while True:
            time.sleep(every_s)
            keeper = keeper_ref()
            if keeper is None:
                return
            with keeper.lock:
                last = list(keeper.last.values())
            del keeper
            for gauge, value, tags in last:
                gauge.set(value, tags=tags)


class LearnerMetrics:
    """The run's series: each iteration's metrics.jsonl row, as gauges and counters (recorded by the driver's
    `learner.run_log.RunLog`)."""

    def __init__(self, run: str, iterations: int) -> None:
        tags = {"run": run}
        self.instruments = {m.key: (m, m.instrument(tags)) for m in LEARNER if m.key is not None}
        self.done = by_name("solrl_iterations_done").instrument(tags)
        self.components = REWARD_COMPONENT.instrument(tags)
        self.eval_details = EVAL_DETAIL.instrument(tags)
        self.iterations = iterations
        self.kept = KeptGauges()

    def close(self) -> None:
        """The job ended (`cluster.runtime.driver.stop`): its gauges are no longer kept."""
        self.kept.close()

    def record(self, values: dict[str, Any]) -> None:
        """The gauges are kept (`KeptGauges`): the held-out values of the last evaluation stay on the
        endpoint until the next one (every eval.every), the others until the next record."""
        if "iteration" in values:
            self.kept.set(self.done, float(values["iteration"] + 1))
        values = {**values, "iterations_planned": self.iterations}
        for key, (metric, instrument) in self.instruments.items():
            value = values.get(key)
            if metric.kind == "gauge" and _finite(value):
                self.kept.set(instrument, float(value))
            elif metric.kind == "counter" and value:  # bool `skipped` counts one
                instrument.inc(float(value))
        for key, value in values.items():
            if key.startswith("reward_") and key not in _NOT_COMPONENTS and _finite(value):
                self.kept.set(self.components, float(value), tags={"reward": key.removeprefix("reward_")})
            elif key.startswith("eval_") and key != "eval_reward" and _finite(value):
                self.kept.set(self.eval_details, float(value), tags={"detail": key.removeprefix("eval_")})


class ExplorerMetrics:
    """An explorer's own series, and the snapshot loads its next ranked group reports to the driver (which
    counts the job's totals from the groups)."""

    def __init__(self, run: str, index: int) -> None:
        tags = {"run": run, "explorer": str(index)}
        (self.candidates, self.busy, self.syncs, self.sync_seconds, self.version) = (
            m.instrument(tags) for m in EXPLORER)
        self.unreported = (0, 0.0)  # snapshots loaded and their seconds, since the last group
        self.kept = KeptGauges()

    def explored(self, group) -> None:
        """Count `group` and hand it the snapshot loads since the previous one (`RankedGroup.syncs`, `sync_s`)."""
        self.candidates.inc(float(len(group.seeds)))
        self.busy.inc(float(group.seconds))
        (group.syncs, group.sync_s), self.unreported = self.unreported, (0, 0.0)

    def synced(self, info: dict[str, float]) -> None:
        seconds = info["fetch_s"] + info["load_s"]
        self.syncs.inc()
        self.sync_seconds.inc(seconds)
        self.kept.set(self.version, float(info["version"]))
        self.unreported = (self.unreported[0] + 1, self.unreported[1] + seconds)


class ScorerMetrics:
    def __init__(self, run: str, index: int) -> None:
        self.requests, self.batches, self.images, self.busy = (m.instrument({"run": run, "scorer": str(index)})
                                                               for m in SCORER)

    def scored(self, images: int, seconds: float) -> None:
        self.batches.inc()
        if images:
            self.images.inc(float(images))
        if seconds > 0:
            self.busy.inc(seconds)
