"""The Grafana dashboard is generated from the metric table: committed, complete and installable.

Whether each query names a series a real run exports is `test_cluster_metrics.py`'s job (it scrapes one);
these checks need no Ray.
"""

import json
from pathlib import Path

from actors.metrics import METRICS, UNITS
from cluster.monitoring.grafana import (
    DASHBOARD_FILE,
    OUTPUT_DIR_ENV,
    PANELS,
    build_dashboard,
    install_dashboard,
    metric_names,
    promql,
    queries,
    render_json,
    splice_tables,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"


def test_the_committed_dashboard_is_the_generated_one():
    assert DASHBOARD_FILE.read_text() == render_json(), "regenerate it: python -m cluster.grafana"


def test_every_declared_metric_is_on_a_panel_and_every_query_reads_one():
    used: set[str] = set()
    for expr in queries(build_dashboard()):
        names = metric_names(expr)
        assert names, expr
        used |= names
    assert used == {m.series for m in METRICS}


def test_every_metric_and_panel_has_a_description_and_a_known_unit():
    for metric in METRICS:
        assert metric.unit in UNITS and metric.description, metric
        assert metric.name.startswith("solrl_") and "run" in metric.tags, metric
    for panel in PANELS:
        assert panel.unit in UNITS and panel.description and panel.queries, panel.title
    ids = [p["id"] for p in build_dashboard()["panels"]]
    assert ids == list(range(1, len(PANELS) + 1))


def test_the_panels_tile_the_grid_without_overlap():
    cells: set[tuple[int, int]] = set()
    for panel in build_dashboard()["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, panel["title"]
        cells |= mine


def test_promql_leaves_no_grafana_variable_and_keeps_the_query_otherwise():
    for expr in queries(build_dashboard()):
        plain = promql(expr, window="20s", range_="10m")
        assert "$" not in plain, plain
        assert plain.replace('".*"', '"$run"').replace("[20s]", "[$__rate_interval]") \
            .replace("[10m]", "[$__range]") == expr


def test_install_puts_it_where_ray_provisions_grafana(tmp_path, monkeypatch):
    monkeypatch.delenv(OUTPUT_DIR_ENV, raising=False)
    target = install_dashboard(tmp_path, wait_s=0)
    assert target == tmp_path / "metrics" / "grafana" / "dashboards" / DASHBOARD_FILE.name
    assert json.loads(target.read_text())["uid"] == "solrl"
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(tmp_path / "elsewhere"))
    assert install_dashboard(tmp_path, wait_s=0).parent == tmp_path / "elsewhere"


def test_the_monitoring_doc_shows_the_current_tables():
    text = DOCS.read_text()
    assert splice_tables(text) == text, "regenerate them: python -m cluster.grafana"
    for metric in METRICS:
        assert f"| `{metric.series}` |" in text
    assert all(f"| {panel.title} |" in text for panel in PANELS)
