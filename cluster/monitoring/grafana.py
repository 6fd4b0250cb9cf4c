"""The job's Grafana dashboard, built from the metric table (`actors.metrics.METRICS`).

    python -m cluster.grafana            # rewrites cluster/monitoring/dashboards/solrl_grafana_dashboard.json and the
                                         # metric and panel tables of docs/monitoring.md
    python -m cluster.grafana --markdown # prints those two tables

A panel names metrics through `actors.metrics`, never as strings, so it cannot query a series the job
does not declare (and a test scrapes a real run to check that each one is really exported). Ray writes
its own dashboards into `<session>/metrics/grafana/dashboards/` and provisions that folder into Grafana
(`ray/dashboard/modules/metrics/metrics_head.py`); `install_dashboard` puts this one beside them, so a
Grafana started as Ray's docs describe shows it in the "Ray" folder with Ray's defaults. Two variables:
`datasource` (Ray's convention) and `run` (a job: its namespace `solrl-<run directory name>-<tag>`,
from the `run` label).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from actors.metrics import METRICS, UNITS, by_name
from cluster.reports.doc_sections import splice

DASHBOARD_FILE = Path(__file__).parent / "dashboards" / "solrl_grafana_dashboard.json"
MONITORING_DOC = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"  # absent in an installed wheel
UID = "solrl"
RUN = 'run=~"$run"'
RATE = "$__rate_interval"  # Grafana's own; `promql` gives Prometheus a fixed window instead
# Ray's env var for the folder it writes its dashboards to (metrics_head.GRAFANA_DASHBOARD_OUTPUT_DIR_ENV_VAR)
OUTPUT_DIR_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"


def series(name: str) -> str:
    """A declared metric's Prometheus series (KeyError for an undeclared one)."""
    return by_name(name).series


def sel(name: str, extra: str = "") -> str:
    return f"{series(name)}{{{RUN}{', ' + extra if extra else ''}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str  # a key of actors.metrics.UNITS
    queries: tuple[Query, ...]
    stacked: bool = False
    kind: str = "timeseries"  # or "stat"
    width: int = 12


PANELS = (
    Panel("Progress", "Iterations finished of the planned run.iterations, explorers taking slots and joining, "
          "and the job's candidates explored and snapshots loaded (the driver's totals: whole across explorer "
          "restarts).", "short",
          (Query(f"max by (run) ({sel('solrl_iterations_done')})", "iterations done {{run}}"),
           Query(f"max by (run) ({sel('solrl_iterations_planned')})", "planned {{run}}"),
           Query(f"max by (run) ({sel('solrl_explorers')})", "explorers {{run}}"),
           Query(f"max by (run) ({sel('solrl_explorers_joining')})", "explorers joining {{run}}"),
           Query(f"max by (run) ({sel('solrl_job_explored_candidates')})", "candidates explored {{run}}"),
           Query(f"max by (run) ({sel('solrl_job_weight_syncs')})", "snapshots loaded {{run}}")),
          kind="stat", width=24),
    Panel("Reward of the kept samples", "Mean and max true (full-precision) reward of the samples the learner "
          "trained on, and the explorers' low-precision proxy reward of all candidates.", "none",
          (Query(f"{sel('solrl_reward_mean')}", "mean {{run}}"), Query(f"{sel('solrl_reward_max')}", "max {{run}}"),
           Query(f"{sel('solrl_proxy_reward_mean')}", "proxy (all candidates) {{run}}"))),
    Panel("Held-out reward", "Full-precision reward on held-out prompts and fixed seeds (every eval.every "
          "iterations), and each reward detail (accuracy, log p, components).", "none",
          (Query(f"{sel('solrl_eval_reward')}", "held-out reward {{run}}"),
           Query(f"{sel('solrl_eval_detail')}", "{{detail}} {{run}}"))),
    Panel("Reward per component", "Each configured reward's mean on the kept samples, before weighting.", "none",
          (Query(f"{sel('solrl_reward_component')}", "{{reward}} {{run}}"),)),
    Panel("Rank fidelity", "Spearman ρ between the explorers' proxy rewards and the learner's true rewards of the "
          "kept seeds, and the share of kept seeds on the right side of the true median.", "none",
          (Query(f"{sel('solrl_rank_spearman')}", "ρ {{run}}"),
           Query(f"{sel('solrl_selection_precision')}", "selection precision {{run}}"))),
    Panel("Seconds per phase", "Stacked: the slowest explorer's seconds, the learner's regeneration (streamed: "
          "overlapped with exploration), update and publish seconds of each iteration.", "s",
          (Query(f"{sel('solrl_explore_seconds')}", "explore {{run}}"),
           Query(f"{sel('solrl_regenerate_streamed_seconds')}", "regenerate, streamed {{run}}"),
           Query(f"{sel('solrl_regenerate_seconds')}", "regenerate {{run}}"),
           Query(f"{sel('solrl_train_seconds')}", "train {{run}}"),
           Query(f"{sel('solrl_sync_seconds')}", "sync {{run}}")), stacked=True),
    Panel("Iteration seconds", "The learner's seconds per iteration (regenerate + train), against the "
          "slowest explorer's: the longer one sets the pace.", "s",
          (Query(f"{sel('solrl_iteration_seconds')}", "learner {{run}}"),
           Query(f"{sel('solrl_explore_seconds')}", "slowest explorer {{run}}"))),
    Panel("Step price: exploration vs regeneration", "Seconds per denoising step of one sample: the explore "
          "engine's and the learner's full-precision one, and their ratio (right). Sol-RL gains only while the ratio "
          "is below 1 (the paper's Blackwell FP4: 0.46); an emulated format sits above it.", "none",
          (Query(f"{sel('solrl_explore_regen_step_ratio')}", "explore / regenerate {{run}}"),
           Query(f"{sel('solrl_explore_step_seconds')}", "explore s/step {{run}}"),
           Query(f"{sel('solrl_regenerate_step_seconds')}", "regenerate s/step {{run}}"))),
    Panel("Policy version and lag", "The learner's newest policy version, each explorer's engine version and "
          "the snapshots its process has loaded, and the largest lag of a trained group (async mode).", "short",
          (Query(f"{sel('solrl_policy_version')}", "learner {{run}}"),
           Query(f"{sel('solrl_explorer_policy_version')}", "explorer {{explorer}} {{run}}"),
           Query(f"sum by (run, explorer) ({sel('solrl_weight_syncs')})", "snapshots loaded {{explorer}} {{run}}"),
           Query(f"{sel('solrl_policy_lag')}", "lag {{run}}"))),
    Panel("Learner idle fraction", "Share of each iteration the learner waited for explorers: near 0, the "
          "learner is the bottleneck; near 1, add explorers.", "percentunit",
          (Query(f"{sel('solrl_learner_idle_fraction')}", "{{run}}"),)),
    Panel("Candidates per second, per explorer", "Candidates explored per second by each explorer process (its "
          "index and node), all explorers together from the driver's count, and within each iteration as the "
          "driver measured it.", "cps",
          (Query(f"sum by (run, explorer, NodeAddress) (rate({sel('solrl_explored_candidates')}[{RATE}]))",
                 "explorer {{explorer}} @ {{NodeAddress}}"),
           Query(f"sum by (run) (rate({sel('solrl_job_explored_candidates')}[{RATE}]))", "all {{run}}"),
           Query(f"{sel('solrl_candidates_per_second')}", "all, within iterations {{run}}"))),
    Panel("Explorer utilisation", "Share of wall time each explorer spent exploring, and loading snapshots; "
          "and the pool's mean (the driver's totals over the explorers taking slots).", "percentunit",
          (Query(f"sum by (run, explorer) (rate({sel('solrl_explorer_busy_seconds')}[{RATE}]))",
                 "exploring {{explorer}}"),
           Query(f"sum by (run, explorer) (rate({sel('solrl_explorer_sync_seconds')}[{RATE}]))",
                 "loading weights {{explorer}}"),
           Query(f"sum by (run) (rate({sel('solrl_job_explorer_busy_seconds')}[{RATE}])) / "
                 f"max by (run) ({sel('solrl_explorers')})", "exploring, pool mean {{run}}"),
           Query(f"sum by (run) (rate({sel('solrl_job_explorer_sync_seconds')}[{RATE}])) / "
                 f"max by (run) ({sel('solrl_explorers')})", "loading weights, pool mean {{run}}"))),
    Panel("Weight sync", "Bytes of weights the learner publishes per second (one copy to each node's sync "
          "service).", "Bps",
          (Query(f"sum by (run) (rate({sel('solrl_weight_sync_bytes')}[{RATE}]))", "published {{run}}"),)),
    Panel("Faults", "Updates skipped (NaN/inf reward or loss), micro-batches dropped, slots re-dispatched after "
          "an explorer died, explorer deaths, explorers lost (removed after cluster.explorers.lost_after_s "
          "unreachable: their node left, no room elsewhere) and stale groups dropped, within the chosen range.",
          "short",
          (Query(f"sum by (run) (increase({sel('solrl_skipped_updates')}[$__range]))", "skipped updates {{run}}"),
           Query(f"sum by (run) (increase({sel('solrl_dropped_micro_batches')}[$__range]))",
                 "dropped micro-batches {{run}}"),
           Query(f"sum by (run) (increase({sel('solrl_explorer_retries')}[$__range]))",
                 "re-dispatched slots {{run}}"),
           Query(f"sum by (run) (increase({sel('solrl_explorer_deaths')}[$__range]))", "explorer deaths {{run}}"),
           Query(f"sum by (run) (increase({sel('solrl_explorers_lost')}[$__range]))", "explorers lost {{run}}"),
           Query(f"sum by (run) (increase({sel('solrl_dropped_groups')}[$__range]))",
                 "stale groups dropped {{run}}")), kind="stat"),
    Panel("Reward scorers", "Per scorer actor (cluster.scorers.count > 0): requests and images scored per "
          "second, and images per scored batch (requests merged up to cluster.scorers.max_batch).", "short",
          (Query(f"sum by (run, scorer) (rate({sel('solrl_scorer_requests')}[{RATE}]))", "requests/s {{scorer}}"),
           Query(f"sum by (run, scorer) (rate({sel('solrl_scorer_images')}[{RATE}]))", "images/s {{scorer}}"),
           Query(f"sum by (run, scorer) (rate({sel('solrl_scorer_images')}[{RATE}])) / sum by (run, scorer) "
                 f"(rate({sel('solrl_scorer_batches')}[{RATE}]))", "images per batch {{scorer}}"))),
    Panel("Scorer utilisation", "Share of wall time each scorer actor spent scoring.", "percentunit",
          (Query(f"sum by (run, scorer) (rate({sel('solrl_scorer_busy_seconds')}[{RATE}]))", "scoring {{scorer}}"),)),
)


def _panel_json(panel: Panel, pid: int, x: int, y: int, height: int) -> dict:
    defaults: dict = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
                              "fillOpacity": 40 if panel.stacked else 0, "lineWidth": 1, "showPoints": "auto"}
    options = ({"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "none"}} if panel.kind == "timeseries"
               else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                     "textMode": "value_and_name", "colorMode": "none", "graphMode": "none"})
    return {"id": pid, "type": panel.kind, "title": panel.title, "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": height, "w": panel.width, "x": x, "y": y},
            "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
            "targets": [{"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, q in enumerate(panel.queries)]}


def build_dashboard() -> dict:
    """The dashboard JSON (Grafana schema 39): two panels a row, stat panels short."""
    panels, x, y, row_height = [], 0, 0, 0
    for pid, panel in enumerate(PANELS, start=1):
        height = 5 if panel.kind == "stat" else 8
        if x + panel.width > 24:  # the next row starts below the row's tallest panel
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel_json(panel, pid, x, y, height))
        x, row_height = x + panel.width, max(row_height, height)
    run_query = f"label_values({series('solrl_policy_version')}, run)"
    return {
        "uid": UID, "title": "Sol-RL job", "tags": ["solrl", "ray"], "schemaVersion": 39, "version": 1,
        "editable": True, "time": {"from": "now-1h", "to": "now"}, "refresh": "10s",
        "description": "Sol-RL (FP4 explore, BF16 train): reward, rank fidelity, phases, policy lag, explorers, "
                       "weight sync and faults. Generated by python -m cluster.grafana.",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "options": []},
            {"name": "run", "label": "Run", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "definition": run_query, "query": {"query": run_query, "refId": "run"}, "refresh": 2,
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "options": [], "sort": 1}]},
        "panels": panels,
    }


def queries(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The series a PromQL expression reads (this dashboard's metrics all start with ray_solrl_)."""
    return set(re.findall(r"\bray_solrl_[a-z0-9_]+\b", expr))


def promql(expr: str, window: str = "1m", range_: str = "10m") -> str:
    """The expression as plain Prometheus evaluates it: Grafana's variables replaced."""
    return expr.replace("$__rate_interval", window).replace("$__range", range_).replace('"$run"', '".*"')


def render_json() -> str:
    return json.dumps(build_dashboard(), indent=2, ensure_ascii=False) + "\n"


def metrics_table() -> str:
    """docs/monitoring.md's table of every exported series."""
    lines = ["| series | type | unit | labels (besides Ray's) | what it is |", "|---|---|---|---|---|"]
    for m in METRICS:
        lines.append(f"| `{m.series}` | {m.kind} | {UNITS[m.unit] or 'value'} | {', '.join(m.tags)} | "
                     f"{m.description} |")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """docs/monitoring.md's table of the dashboard's panels."""
    lines = ["| panel | unit | queries | what it shows |", "|---|---|---|---|"]
    for p in PANELS:
        exprs = "<br>".join(f"`{q.expr}`" for q in p.queries)
        lines.append(f"| {p.title} | {UNITS[p.unit] or 'value'} | {exprs} | "
                     f"{p.description} |")
    return "\n".join(lines) + "\n"


def splice_tables(doc: str) -> str:
    """`doc` with the text between `<!-- metrics:begin/end -->` and `<!-- panels:begin/end -->` regenerated."""
    for section, table in (("metrics", metrics_table), ("panels", markdown_table)):
        doc = splice(doc, section, table())
    return doc


def grafana_dashboards_dir(session_dir: str | Path) -> Path:
    """Where Ray writes its dashboards for this session (its env var first, as Ray reads it)."""
    return Path(os.environ.get(OUTPUT_DIR_ENV) or Path(session_dir) / "metrics" / "grafana" / "dashboards")


def install_dashboard(session_dir: str | Path, wait_s: float = 20.0) -> Path:
    """Write the dashboard beside Ray's own. Ray's dashboard process empties that folder when it starts
    (after `ray.init` returns), so wait up to `wait_s` for its default dashboard to appear first; without
    a Ray dashboard (include_dashboard=False) the file is written anyway."""
    folder = grafana_dashboards_dir(session_dir)
    deadline = time.monotonic() + wait_s
    while not (folder / "default_grafana_dashboard.json").exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / DASHBOARD_FILE.name
    target.write_text(DASHBOARD_FILE.read_text())
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cluster.grafana", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="print the panel table instead")
    args = parser.parse_args(argv)
    if args.markdown:
        print(metrics_table(), markdown_table(), sep="\n", end="")
        return
    DASHBOARD_FILE.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_FILE.write_text(render_json())
    print(f"wrote {DASHBOARD_FILE} ({len(PANELS)} panels, {len(queries(build_dashboard()))} queries)")
    if MONITORING_DOC.is_file():
        MONITORING_DOC.write_text(splice_tables(MONITORING_DOC.read_text()))
        print(f"rewrote the metric and panel tables of {MONITORING_DOC}")


if __name__ == "__main__":
    main()
