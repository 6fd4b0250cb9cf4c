"""What the node's Prometheus endpoint shows of gauges between their sets.

Ray 2.60 keeps a gauge's value for two report intervals after its last `set`, then drops the series
(`ray/_private/telemetry/open_telemetry_metric_recorder.py`, the gauge TTL): with `eval.every` iterations
between evaluations the held-out series would vanish from the dashboard, and an explorer's policy version, set
once per snapshot, would show for 20 s of an iteration that takes minutes. `actors.metrics.KeptGauges` sets each
gauge's last value again every half interval. A 1 s report interval makes the TTL 2 s, so the test is short (a
gauge set once was measured gone from the endpoint 3 s later; with Ray's default 10 s interval, 20-30 s later).
"""

from __future__ import annotations

import time
import urllib.request

import pytest
import ray

from actors.metrics import ExplorerMetrics, LearnerMetrics

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Rank0:
    """The learner's side of the metrics, alone: `LearnerMetrics` recording an iteration's record."""

    def __init__(self) -> None:
        self.metrics = LearnerMetrics("probe", iterations=10)

    def record(self, values: dict) -> None:
        self.metrics.record(values)

    def close(self) -> None:
        self.metrics.close()


@ray.remote(num_cpus=0)
class Explorer0:
    """An explorer's side: `ExplorerMetrics` recording one snapshot load, then nothing."""

    def __init__(self) -> None:
        self.metrics = ExplorerMetrics("probe", 0)

    def synced(self, version: int) -> None:
        self.metrics.synced({"fetch_s": 0.1, "load_s": 0.2, "version": version})


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("ray_solrl_")}


def test_held_out_series_stay_on_the_endpoint_between_evaluations(own_ray, monkeypatch):
    # for every process of this Ray, the metrics agent included (`_system_config` does not reach the agent's TTL)
    monkeypatch.setenv("RAY_metrics_report_interval_ms", "1000")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        rank0, explorer0 = Rank0.remote(), Explorer0.remote()
        port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
        ray.get(rank0.record.remote({"iteration": 0, "reward_mean": 1.0, "eval_reward": 2.5, "eval_accuracy": 0.75}))
        ray.get(explorer0.synced.remote(3))  # its only set
        seen: list[dict[str, float]] = []
        for iteration in range(1, 9):  # 8 s of iterations without an evaluation: four gauge TTLs
            ray.get(rank0.record.remote({"iteration": iteration, "reward_mean": 1.0 + iteration}))
            time.sleep(1.0)
            seen.append(scrape(port))
        ray.get(rank0.close.remote())  # the job ended (driver.stop): its gauges age out, the explorer's stay
        time.sleep(4.0)
        after = scrape(port)
    finally:
        ray.shutdown()
    late = seen[-3:]  # long after the evaluation's own `set` would have aged out
    assert all(s.get("ray_solrl_iterations_done") == 9 for s in late[-1:]), late
    assert all(s.get("ray_solrl_eval_reward") == 2.5 for s in late), late
    assert all(s.get("ray_solrl_eval_detail") == 0.75 for s in late), late
    assert all(s.get("ray_solrl_explorer_policy_version") == 3 for s in late), late
    assert all(s.get("ray_solrl_weight_syncs_total") == 1 for s in late), late
    assert "ray_solrl_eval_reward" not in after and "ray_solrl_iterations_done" not in after, after
    assert after.get("ray_solrl_explorer_policy_version") == 3, after
