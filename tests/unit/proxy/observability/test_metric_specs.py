"""The proxy's metrics are declared once (rtvideo.proxy.observability.metrics): the registry
holds each as declared, the docs' tables list exactly those, and every proxy metric the
dashboards and alerts in deploy/ name is one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import Counter, Gauge, Histogram

from rtvideo.proxy.observability.metrics import DECLARED, MetricSpec, ProxyMetrics, by_label, value

ROOT = Path(__file__).resolve().parents[4]
#: the docs whose tables list the proxy's metrics (the recordings' are with the recordings)
DOCS = (ROOT / "docs" / "operations.md", ROOT / "docs" / "recordings.md")
KINDS = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}
#: what a scrape adds to a family's name, by type
SUFFIXES = {"counter": ("_total",), "gauge": (), "histogram": ("_bucket", "_count", "_sum")}


def declared() -> dict[str, str]:
    return {spec.name: KINDS[spec.kind] for spec in DECLARED}


def test_the_registry_holds_every_declared_metric_with_its_type_help_and_labels() -> None:
    metrics = ProxyMetrics(recordings=True)
    for attribute, spec in vars(ProxyMetrics).items():
        if not isinstance(spec, MetricSpec):
            continue
        assert attribute == spec.name.removeprefix("rtvideo_proxy_").removeprefix("rtvideo_")
        metric = getattr(metrics, attribute)
        assert isinstance(metric, spec.kind)
        if spec.labels:
            metric = metric.labels(*("x" for _ in spec.labels))
        if isinstance(metric, Histogram):
            metric.observe(0.5)
        else:
            metric.inc()
    families = {f.name: f for f in metrics.registry.collect() if f.name.startswith("rtvideo_")}
    assert set(families) == set(declared())
    for spec in DECLARED:
        family = families[spec.name]
        assert (family.type, family.documentation) == (KINDS[spec.kind], spec.help)
        label_sets = {frozenset(s.labels) - {"le"} for s in family.samples if not s.name.endswith("_created")}
        assert frozenset(spec.labels) in label_sets
        assert all(labels <= set(spec.labels) for labels in label_sets), spec.name


def test_recordings_metrics_only_with_recordings_and_initial_labels_at_zero() -> None:
    plain, recording = ProxyMetrics(), ProxyMetrics(recordings=True)
    names = {f.name for f in plain.registry.collect()}
    assert "rtvideo_recordings_written" not in names and "rtvideo_proxy_sessions" in names
    assert by_label(recording.recording_failures, "reason") == {"the store is too slow": 0, "write failed": 0}
    assert by_label(plain.rejected, "reason")["awaiting_start"] == 0 and "awaiting_start" in by_label(
        plain.rejected, "reason"
    )
    recording.recording_written(120)
    assert value(recording.recordings_written) == 1 and value(recording.recording_bytes) == 120


def test_endpoint_series_come_and_go_together() -> None:
    metrics = ProxyMetrics()
    metrics.endpoint_added("10.0.0.1:8001")
    metrics.endpoint_refusals.labels("10.0.0.1:8001").inc()
    endpoint_specs = [s for s in DECLARED if s.labels == ("endpoint",)]
    assert len(endpoint_specs) == 8
    for spec in endpoint_specs:
        assert "10.0.0.1:8001" in by_label(getattr(metrics, spec.name.removeprefix("rtvideo_proxy_")), "endpoint")
    assert by_label(metrics.endpoint_refusals, "endpoint") == {"10.0.0.1:8001": 1}
    metrics.endpoint_removed("10.0.0.1:8001")
    metrics.endpoint_removed("10.0.0.1:8001")  # twice: nothing left to remove
    assert not any(
        by_label(getattr(metrics, s.name.removeprefix("rtvideo_proxy_")), "endpoint") for s in endpoint_specs
    )


def documented(text: str) -> dict[str, str]:
    """The proxy's metrics in a doc's tables, by family name: the rows whose first cell names
    `rtvideo_…` metrics, with a type cell (after a `where` cell in tables that have one; the
    model's rows are left out). A counter is listed as scraped, with `_total`."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`(rtvideo_\w+)(?:\{[^}`]*\})?`", cells[0])
        if not names or len(cells) < 3:
            continue
        where = cells[1] if cells[1] in ("proxy", "model") else None
        if where == "model":
            continue
        kinds = re.findall(r"\b(counter|gauge|histogram)\b", cells[2 if where else 1])
        assert len(kinds) in (1, len(names)), line
        for name, kind in zip(names, kinds * len(names) if len(kinds) == 1 else kinds, strict=True):
            if kind == "counter":
                assert name.endswith("_total"), line
                name = name.removesuffix("_total")
            assert name not in found, f"{name} listed twice"
            found[name] = kind
    return found


def test_the_docs_tables_list_exactly_the_declared_metrics() -> None:
    listed: dict[str, str] = {}
    for doc in DOCS:
        rows = documented(doc.read_text())
        assert rows, doc
        assert not set(rows) & set(listed), sorted(set(rows) & set(listed))
        listed.update(rows)
    assert listed == declared()


@pytest.mark.parametrize(
    "row, family",
    [
        ("| `rtvideo_proxy_watchers` | gauge | watchers |", {"rtvideo_proxy_watchers": "gauge"}),
        ("| `rtvideo_a_total{x}`, `rtvideo_b` | counter, gauge | |", {"rtvideo_a": "counter", "rtvideo_b": "gauge"}),
        ("| `rtvideo_realtime_factor` | model | histogram | |", {}),
        (
            "| `rtvideo_playback_underrun_seconds` | proxy | histogram | |",
            {"rtvideo_playback_underrun_seconds": "histogram"},
        ),
    ],
)
def test_a_docs_row_reads_as_its_families(row: str, family: dict[str, str]) -> None:
    assert documented(row) == family


def test_what_deploy_names_of_the_proxy_is_declared() -> None:
    known = declared()
    named = {
        name
        for path in (ROOT / "deploy").rglob("*")
        if path.is_file() and path.suffix in (".yaml", ".yml", ".json")
        for name in re.findall(r"rtvideo_proxy_\w+", path.read_text())
    }
    assert len(named) >= 5  # the dashboards and alerts are read at all
    for name in named:
        family = next((f for f, kind in known.items() for suffix in ("", *SUFFIXES[kind]) if name == f + suffix), None)
        assert family is not None, f"{name} (deploy/) is no declared proxy metric"
