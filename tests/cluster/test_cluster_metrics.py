"""Dashboard metrics, scraped from the node's Prometheus endpoint of a cluster of this test's own
(no other job's series can mix in), checked for their values, not only their names — with one explorer
death, so the fault counters are checked too."""

from __future__ import annotations

import time
import urllib.request
from collections import defaultdict

import pytest
import ray
from faults import die_on_explore_call
from tiny import tiny_config

from cluster import driver

pytestmark = pytest.mark.ray

ITERATIONS, PROMPTS, CANDIDATES = 2, 2, 8


def scrape(port: int) -> dict[str, float]:
    """Every ray_solrl_* series, summed over its labels (one series per reporting process)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if line.startswith("ray_solrl_"):
            values[line.split("{")[0].split(" ")[0]] += float(line.rsplit(" ", 1)[1])
    return dict(values)


def test_dashboard_metrics_carry_the_runs_values(tmp_path):
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        cfg = tiny_config(f"prompts.per_iteration={PROMPTS}", f"prompts.candidates={CANDIDATES}",
                          f"run.iterations={ITERATIONS}", ray=True)
        # The explorer dies once, in its very first slot: before it counted anything, because a dead
        # process's series leave the endpoint with it (Ray drops them; counts are per process).
        def arm(job, _status) -> None:
            ray.get(job.explorers[0].__ray_call__.remote(die_on_explore_call, 1))

        job, history = driver.run(cfg, str(tmp_path / "metrics"), log=lambda _: None, on_start=arm)
        port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
        wanted = {"ray_solrl_policy_version": ITERATIONS,
                  "ray_solrl_explored_candidates_total": ITERATIONS * PROMPTS * CANDIDATES,
                  "ray_solrl_explorer_deaths_total": 1,
                  "ray_solrl_explorer_retries_total": sum(m.get("explorer_retries", 0) for m in history)}
        deadline, values = time.time() + 60, {}
        while time.time() < deadline:  # metrics reach the endpoint every few seconds
            values = scrape(port)
            if all(values.get(k) == v for k, v in wanted.items()) and "ray_solrl_weight_syncs_total" in values:
                break
            time.sleep(2)
        driver.stop(job)  # after scraping: the learner's gauges leave with its process
    finally:
        ray.shutdown()
    for name, value in wanted.items():
        assert values.get(name) == value, (name, values.get(name), sorted(values))
    assert values["ray_solrl_explorer_retries_total"] >= 1
    assert values["ray_solrl_weight_syncs_total"] >= ITERATIONS  # versions 0 and 1 (2 is never needed)
    assert values["ray_solrl_reward_mean"] == pytest.approx(history[-1]["reward_mean"], rel=1e-6)
    # each configured reward's component, named after it (the only one here: the weighted total itself)
    assert values["ray_solrl_reward_digit_alignment"] == pytest.approx(history[-1]["reward_digit_alignment"], rel=1e-6)
    assert history[-1]["reward_digit_alignment"] == pytest.approx(history[-1]["reward_mean"], rel=1e-6)
    assert values["ray_solrl_train_s"] == pytest.approx(history[-1]["train_s"], rel=1e-6)
    assert 0 <= values["ray_solrl_learner_idle_fraction"] <= 1
    assert values["ray_solrl_rank_spearman"] == pytest.approx(history[-1]["rank_spearman"], rel=1e-6)
    assert values.get("ray_solrl_skipped_updates_total", 0) == 0
