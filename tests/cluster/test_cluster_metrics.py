"""Dashboard metrics, scraped from the node's Prometheus endpoint of a cluster of this test's own (the job's
series selected by its `run` label, as the dashboard does), checked for their values, not only their names —
with one explorer death mid-run, so the fault counters are checked too and the job's exploration totals must
survive it, and a reward scorer, so its series are there. The same scrape checks the Grafana dashboard: every series a
panel queries is one the job really exports. The job ships its weights in the lora codec (explorers merge the
adapters into their own base weights), and ends with the single-process trainer's weights: neither the death, the
scorer, the evaluation nor the codec changes them (a job's cost is mostly starting its actors, so one job carries
them all)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict

import pytest
import ray
import torch
from faults import die_on_explore_call
from jobs import final_weights
from tiny import tiny_config

from actors.metrics import LEARNER
from cluster.monitoring.grafana import build_dashboard, metric_names, queries
from cluster.runtime import driver

pytestmark = pytest.mark.ray

ITERATIONS, PROMPTS, CANDIDATES = 2, 2, 8


def scrape(port: int, run: str) -> tuple[dict[str, float], dict[str, list[dict[str, str]]]]:
    """Every ray_solrl_* series of the job `run` (its `run` label, as the dashboard selects a job) summed over
    its other labels (one series per reporting process), and each series' label sets. Another job's series
    (one that ran before in this process, within Ray's gauge TTL) are not this job's numbers."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = defaultdict(float)
    labels: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in text.splitlines():
        if line.startswith("ray_solrl_") and "{" in line:
            name = line.split("{")[0]
            pairs = line[line.index("{") + 1:line.rindex("}")]
            tags = dict(p.split("=", 1) for p in pairs.replace('"', "").split(",") if "=" in p)
            if tags.get("run") == run:
                values[name] += float(line.rsplit(" ", 1)[1])
                labels[name].append(tags)
    return dict(values), dict(labels)


def test_dashboard_metrics_carry_the_runs_values(local_ray, tmp_path, reference_weights):
    cfg = tiny_config(f"prompts.per_iteration={PROMPTS}", f"prompts.candidates={CANDIDATES}",
                      f"run.iterations={ITERATIONS}", f"eval.every={ITERATIONS}", "cluster.scorers.count=1",
                      "cluster.scorers.num_cpus=0.25", "cluster.codec=lora", ray=True)
    # The only explorer dies once, mid-run: in its third slot (iteration 1's first), after it counted
    # iteration 0's two groups and one snapshot. Ray 2.60 keeps a dead process's series (its own WorkerId) with
    # what it had reported; what it counted after its last report (they go every few seconds) is lost, and the
    # restart counts in a series of its own. The job's totals are the driver's and lose nothing.
    def arm(job, _status) -> None:
        ray.get(job.explorers[0].__ray_call__.remote(die_on_explore_call, 3))

    logged: list[str] = []
    job, history = driver.run(cfg, str(tmp_path / "metrics"), log=logged.append, on_start=arm)
    try:
        named = {n: ray.get(ray.get_actor(n, namespace=job.namespace).__ray_call__.remote(repr))
                 for n in ("solrl-learner-0", "solrl-explorer-0", "solrl-scorer-0")}
        # the run is over: the scorer's own record of what it scored is final
        batches = ray.get(ray.get_actor("solrl-scorer-0", namespace=job.namespace).batch_sizes.remote())
        port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
        # Every slot was explored once to completion (the one the explorer died in never arrived, its retry
        # did); each iteration loaded one snapshot (v0, then v1 in the restarted process).
        wanted = {"ray_solrl_policy_version": ITERATIONS,
                  "ray_solrl_job_explored_candidates_total": ITERATIONS * PROMPTS * CANDIDATES,
                  "ray_solrl_job_weight_syncs_total": ITERATIONS,
                  "ray_solrl_explorer_deaths_total": 1,
                  "ray_solrl_explorer_retries_total": sum(m.get("explorer_retries", 0) for m in history)}
        # explorer 0's own series: at least the restarted process's iteration 1, at most the job's total (the
        # dead process's iteration 0 counted as far as it was reported)
        per_process = {"ray_solrl_explored_candidates_total": (PROMPTS * CANDIDATES, ITERATIONS * PROMPTS * CANDIDATES),
                       "ray_solrl_weight_syncs_total": (1, ITERATIONS)}
        # every series the Grafana dashboard queries: the restarted explorer's gauges come with its first report,
        # which on a loaded machine can be the last to arrive
        queried = set().union(*(metric_names(expr) for expr in queries(build_dashboard())))
        deadline, values, labels = time.time() + 60, {}, {}
        while time.time() < deadline:  # metrics reach the endpoint every few seconds
            values, labels = scrape(port, job.namespace)
            if all(values.get(k) == v for k, v in wanted.items()) \
                    and all(values.get(k, 0) >= low for k, (low, _) in per_process.items()) \
                    and values.get("ray_solrl_scorer_images_total") == sum(batches) and queried <= values.keys():
                break
            time.sleep(2)
        weights = final_weights(job, tmp_path / "metrics" / "final")
    finally:
        driver.stop(job)  # after scraping: the learner's gauges leave with its process
    assert weights.keys() == reference_weights.keys()
    for key, value in reference_weights.items():  # the lora merge runs in another process: equal to fp32 rounding
        torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6)
    for name, value in wanted.items():
        assert values.get(name) == value, (name, values.get(name), sorted(values))
    for name, (low, high) in per_process.items():
        assert low <= values[name] <= high, (name, values[name])
    assert values["ray_solrl_explored_candidates_total"] % CANDIDATES == 0  # whole groups: one increment each
    # One writer, one record: metrics.jsonl holds the rows the driver returned and the gauges were set from,
    # with every number a dashboard gauge or the progress line shows
    rows = [json.loads(x) for x in (tmp_path / "metrics" / "metrics.jsonl").read_text().splitlines()]
    assert json.dumps(rows) == json.dumps(history)  # (NaN-safe: a constant group has no ρ)
    shown = {m.key for m in LEARNER if m.key is not None and m.kind == "gauge"} - {"iterations_planned"}
    assert shown <= rows[-1].keys(), shown - rows[-1].keys()
    assert sum(r.get("explorer_deaths", 0) for r in rows) == 1 and "iteration_wall_s" in rows[0]
    lines = [line for line in logged if line.startswith("iteration ")]
    assert len(lines) == ITERATIONS
    for line, row in zip(lines, rows, strict=True):
        assert f"kept reward {row['reward_mean']:7.3f}" in line and f"train {row['train_s']:.1f}s" in line
    assert f"held-out {rows[-1]['eval_reward']:7.3f}" in lines[-1]
    assert values["ray_solrl_explorer_retries_total"] >= 1
    # the driver's totals are the records' sums: what every group that arrived reported
    assert [m["explored_candidates"] for m in rows] == [PROMPTS * CANDIDATES] * ITERATIONS
    assert sum(m["explorer_syncs"] for m in rows) == ITERATIONS  # versions 0 and 1 (2 is never needed)
    for series, key in (("ray_solrl_job_explorer_busy_seconds_total", "explore_busy_s"),
                        ("ray_solrl_job_explorer_sync_seconds_total", "explorer_sync_s")):
        assert values[series] == pytest.approx(sum(m[key] for m in rows), rel=1e-6) and values[series] > 0
    assert values["ray_solrl_explorers_lost_total"] == 0  # exported at 0 from the start
    assert values["ray_solrl_reward_mean"] == pytest.approx(history[-1]["reward_mean"], rel=1e-6)
    # each configured reward's component, labelled with its name (the only one here: the weighted total itself)
    assert [s["reward"] for s in labels["ray_solrl_reward_component"]] == ["digit_alignment"]
    assert values["ray_solrl_reward_component"] == pytest.approx(history[-1]["reward_digit_alignment"], rel=1e-6)
    assert history[-1]["reward_digit_alignment"] == pytest.approx(history[-1]["reward_mean"], rel=1e-6)
    assert values["ray_solrl_train_seconds"] == pytest.approx(history[-1]["train_s"], rel=1e-6)
    assert values["ray_solrl_iterations_done"] == ITERATIONS
    assert values["ray_solrl_weight_sync_bytes_total"] == pytest.approx(sum(m["sync_bytes"] for m in history))
    assert values["ray_solrl_weight_sync_bytes_total"] > 0
    assert 0 <= values["ray_solrl_learner_idle_fraction"] <= 1
    assert values["ray_solrl_rank_spearman"] == pytest.approx(history[-1]["rank_spearman"], rel=1e-6)
    assert values["ray_solrl_skipped_updates_total"] == 0  # exported at 0 from the start
    # the job's label is its namespace (unique per job, where two run directories may share a name, and it starts
    # with the run directory's); per-actor series carry their actor's index, as in its name
    assert job.namespace.startswith(f"solrl-{(tmp_path / 'metrics').name}-")
    assert {s["explorer"] for s in labels["ray_solrl_explored_candidates_total"]} == {"0"}
    assert {s["scorer"] for s in labels["ray_solrl_scorer_requests_total"]} == {"0"}
    # the scorer's counters agree with its own record of the batches it scored
    assert values["ray_solrl_scorer_batches_total"] == len(batches) > 0
    assert values["ray_solrl_scorer_images_total"] == sum(batches)
    assert values["ray_solrl_scorer_requests_total"] >= len(batches)
    assert all(name == shown for name, shown in named.items()), named  # the name is also its repr (log prefix)
    # the Grafana dashboard queries only series this run exported
    for expr in queries(build_dashboard()):
        assert metric_names(expr), expr
        assert metric_names(expr) <= set(values), (expr, sorted(metric_names(expr) - set(values)))
