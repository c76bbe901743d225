"""docs/grafana/: the dashboard and alert rules name only metrics that `/metrics` renders.

The metric families come from the real `/metrics` view (in process, a real Redis and
Postgres): its `# TYPE` lines list every family even with no calls recorded, so a metric
renamed in dashboard/metrics.py, or misspelt in a file, fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML: a dependency of drf-spectacular (requirements.txt)
from django.test import Client

GRAFANA = Path(__file__).resolve().parents[2] / "docs" / "grafana"
# Series Prometheus itself makes for every scrape target, not rendered by Sluice.
SYNTHETIC = {"up"}

_STRINGS = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.$:])[A-Za-z_:][A-Za-z0-9_:]*(?![\w:]|\s*\()")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "group_left",
    "group_right",
}
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers left once strings, label
    matchers, ranges and grouping clauses are gone, that are not called as functions."""
    text = _STRINGS.sub("", expr)
    for pattern in (_MATCHERS, _RANGES, _GROUPING):
        text = pattern.sub(" ", text)
    return {name for name in _IDENT.findall(text) if name.lower() not in _KEYWORDS}


def rendered_names() -> set[str]:
    """Sample names `/metrics` can expose, from its `# TYPE` lines."""
    response = Client().get("/metrics", headers={"Authorization": "Bearer grafana-files"})
    assert response.status_code == 200, response.content
    names: set[str] = set()
    for line in response.content.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            if kind == "counter":
                names.add(family if family.endswith("_total") else family + "_total")
            elif kind == "histogram":
                names |= {family + suffix for suffix in ("_bucket", "_sum", "_count")}
            else:
                names.add(family)
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs: list[str] = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            exprs += [target["expr"] for target in inner.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        exprs += [m.group(1) for m in _LABEL_VALUES.finditer(text)]
    return exprs


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((GRAFANA / "sluice-alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


def test_the_extractor_finds_selectors_and_nothing_else():
    expr = (
        'histogram_quantile(0.95, sum by (le, worker) (rate(sluice_nope_bucket{worker=~"$worker",'
        ' code!="OK"}[$__rate_interval]))) / on (worker) group_left sluice_other > 1e-9'
        " and max(delta(sluice_third[15m:1m])) offset 5m"
    )
    assert metric_names(expr) == {"sluice_nope_bucket", "sluice_other", "sluice_third"}


@pytest.mark.django_db
def test_every_metric_in_the_dashboard_and_alerts_is_rendered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("METRICS_TOKEN", "grafana-files")
    known = rendered_names()
    assert {"sluice_requests_total", "sluice_queue_wait_seconds_bucket"} <= known

    dashboard = json.loads((GRAFANA / "sluice-dashboard.json").read_text())
    rules = alert_rules()
    exprs = dashboard_exprs(dashboard) + [rule["expr"] for rule in rules]
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert len(exprs) > 20 and used
    unknown = {expr: metric_names(expr) - known - SYNTHETIC for expr in exprs}
    assert {expr: names for expr, names in unknown.items() if names} == {}
    # The code label says "OK" for a 200, never "200": a filter on "200" would match nothing.
    assert all('code="200"' not in expr and 'code!="200"' not in expr for expr in exprs)


def test_the_files_are_importable_as_documented():
    dashboard = json.loads((GRAFANA / "sluice-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    rules = alert_rules()
    assert len(rules) >= 5
    for rule in rules:
        assert rule["alert"] and rule["for"], rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert "\n" not in rule["annotations"]["summary"].strip(), rule


def test_the_scrape_example_sends_the_token_from_a_file_under_the_alerted_job_name():
    config = yaml.safe_load((GRAFANA / "prometheus-scrape.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "sluice"  # what SluiceMetricsDown's `up{job="sluice"}` reads
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/prometheus/sluice-metrics-token",
    }
    assert 'up{job="sluice"}' in (GRAFANA / "sluice-alerts.yml").read_text()
