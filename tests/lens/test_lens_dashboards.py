"""Every Grafana panel's SQL runs against the real schema over seeded data.

The dashboards (deploy/helm/primus-safe/dashboards) are written for the
ClickHouse datasource plugin; here its macros and Grafana's variables are
expanded the way the plugin does, template variables take the first value
their own query returns, and each panel's query must return rows (with
something other than NULL in them) from the chDB engine.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from libs.store import open_store
from tests.helpers import ROOT
from tests.lens.lens_seed import seed

DASHBOARDS = ROOT / "deploy" / "helm" / "primus-safe" / "dashboards"
EXPECTED = {"cluster-overview.json", "node-detail.json", "job-detail.json", "bench-fleet.json"}


def expand(sql: str, *, start: float, end: float, interval_s: int,
           variables: dict[str, str]) -> str:
    """The plugin's macros (v4) and Grafana's variables, as text."""
    f, t = int(start), int(end)
    fm, tm = int(start * 1000), int(end * 1000)
    sql = re.sub(r"\$__timeFilter_ms\(([^)]+)\)",
                 rf"\1 >= fromUnixTimestamp64Milli({fm}) AND \1 <= fromUnixTimestamp64Milli({tm})",
                 sql)
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)",
                 rf"\1 >= toDateTime({f}) AND \1 <= toDateTime({t})", sql)
    ms = interval_s * 1000
    sql = re.sub(r"\$__timeInterval_ms\(([^)]+)\)",
                 rf"toStartOfInterval(toDateTime64(\1, 3), INTERVAL {ms} millisecond)", sql)
    sql = re.sub(r"\$__timeInterval\(([^)]+)\)",
                 rf"toStartOfInterval(toDateTime(\1), INTERVAL {interval_s} second)", sql)
    for macro, value in (("$__fromTime_ms", f"fromUnixTimestamp64Milli({fm})"),
                         ("$__toTime_ms", f"fromUnixTimestamp64Milli({tm})"),
                         ("$__fromTime", f"toDateTime({f})"), ("$__toTime", f"toDateTime({t})"),
                         ("$__interval_ms", str(interval_s * 1000)),
                         ("$__interval_s", str(interval_s)), ("$__interval", f"{interval_s}s"),
                         ("$__from", str(fm)), ("$__to", str(tm))):
        sql = sql.replace(macro, value)
    for name, value in variables.items():
        for form in (f"${{{name}:singlequote}}", f"${{{name}:sqlstring}}"):
            sql = sql.replace(form, "'" + value.replace("'", "''") + "'")
        sql = sql.replace(f"${{{name}}}", value).replace(f"[[{name}]]", value)
        sql = re.sub(rf"\${name}\b", value, sql)
    assert "$" not in sql, f"unexpanded macro or variable in: {sql}"
    return sql


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in doc["panels"]:
        out += [panel] + panel.get("panels", [])
    return [p for p in out if p.get("targets")]


@pytest.fixture(scope="module")
def seeded(clickhouse_dsn: str):  # type: ignore[no-untyped-def]
    database = "dash_" + str(int(time.time()))
    client = open_store(clickhouse_dsn)
    stored = seed(client, database)
    client.database = database  # dashboards name tables as the datasource's default db does
    return client, stored


def datasource_kind(doc: dict[str, Any]) -> str:
    """The plugin a dashboard's ``datasource`` variable picks."""
    return next(v["query"] for v in doc["templating"]["list"] if v["type"] == "datasource")


def test_the_four_dashboards_ship_and_use_the_clickhouse_plugin() -> None:
    names = {p.name for p in DASHBOARDS.glob("*.json")}
    assert names >= EXPECTED
    uids = set()
    for path in DASHBOARDS.glob("*.json"):
        doc = json.loads(path.read_text())
        uids.add(doc["uid"])
        assert panels(doc), path.name
        if datasource_kind(doc) == "prometheus":  # its PromQL: tests/e2e/test_prometheus_scrape.py
            continue
        for panel in panels(doc):
            for target in panel["targets"]:
                assert target["datasource"]["type"] == "grafana-clickhouse-datasource"
                assert target["editorType"] == "sql" and target["rawSql"].strip()
    assert len(uids) == len(names)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_panel_query_returns_rows_on_the_real_schema(seeded, name: str) -> None:  # type: ignore[no-untyped-def]
    client, stored = seeded
    assert stored["ingest_node"] > 0 and stored["ingest_job"] > 0
    doc = json.loads((DASHBOARDS / name).read_text())
    end = time.time() + 2  # "now" comes after the seeded rows were stored
    start = end - 3600
    window = {"start": start, "end": end, "interval_s": 60}
    variables: dict[str, str] = {}
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        sql = expand(var["query"], variables=variables, **window)
        rows = client.query(sql).result_rows
        assert rows, f"{name}: variable {var['name']} has no values: {sql}"
        variables[var["name"]] = str(rows[0][0])
    empty = []
    for panel in panels(doc):
        for target in panel["targets"]:
            sql = expand(target["rawSql"], variables=variables, **window)
            try:
                rows = client.query(sql).result_rows
            except Exception as exc:
                pytest.fail(f"{name}: panel {panel['title']!r} failed: {exc}\n{sql}")
            if not rows or all(_blank(v) for row in rows for v in row):
                empty.append(panel["title"])
    assert not empty, f"{name}: panels without rows: {empty}"


def _variables(client: Any, doc: dict[str, Any], window: dict[str, Any]) -> dict[str, str]:
    """Each template variable: the first value its own query returns."""
    variables: dict[str, str] = {}
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            rows = client.query(expand(var["query"], variables=variables, **window)).result_rows
            variables[var["name"]] = str(rows[0][0]) if rows else ""
    return variables


def _series_targets(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(title, SQL) of the panels that bucket time with the plugin's macro."""
    return [(panel["title"], target["rawSql"]) for panel in panels(doc)
            for target in panel["targets"] if "$__timeInterval" in target["rawSql"]
            and "$__timeFilter" in target["rawSql"]]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_time_series_keeps_the_bucket_the_window_starts_in(seeded, name: str) -> None:  # type: ignore[no-untyped-def]
    """``$__timeInterval(time) AS time ... $__timeFilter(time)`` filters on
    the bucket, not the sample: ClickHouse reads an unqualified ``time`` in
    WHERE as the SELECT's alias, so the bucket the window starts in (which
    begins before it) would be dropped. With the macros expanded as the
    plugin does, a window starting 1 s into a bucket must still show that
    bucket wherever samples fall after that second."""
    client, _ = seeded
    doc = json.loads((DASHBOARDS / name).read_text())
    end = time.time() + 2
    wide = {"start": end - 3600, "end": end, "interval_s": 60}
    variables = _variables(client, doc, wide)
    checked = 0
    for title, sql in _series_targets(doc):
        fine = client.query(expand(sql, variables=variables, **{**wide, "interval_s": 1}))
        at = fine.column_names.index("time")
        seconds = sorted({row[at].timestamp() for row in fine.result_rows})
        if not seconds:
            continue
        first = seconds[0] - seconds[0] % 60  # the first minute bucket with samples
        if not any(first + 1 <= s < first + 60 for s in seconds):
            continue  # nothing after its first second: no case to check here
        narrow = client.query(expand(sql, variables=variables, start=first + 1, end=end,
                                     interval_s=60))
        buckets = {row[narrow.column_names.index("time")].timestamp()
                   for row in narrow.result_rows}
        assert first in buckets, (f"{name}: panel {title!r} drops the bucket its window "
                                  f"starts in: filter on the table's column, not the alias")
        checked += 1
    assert checked or not _series_targets(doc), f"{name}: no time series could be checked"


@pytest.mark.parametrize("name", ["job-detail.json", "node-detail.json"])
def test_a_logs_panel_shows_the_message_as_the_line(seeded, name: str) -> None:  # type: ignore[no-untyped-def]
    """Grafana's logs panel takes the first text column as the log line: it
    must be the message (``body``), with the level a column of its own."""
    client, _ = seeded
    doc = json.loads((DASHBOARDS / name).read_text())
    end = time.time() + 2
    window = {"start": end - 3600, "end": end, "interval_s": 60}
    variables = _variables(client, doc, window)
    logs = [t["rawSql"] for p in panels(doc) if p["type"] == "logs" for t in p["targets"]]
    assert logs, name
    for sql in logs:
        result = client.query(expand(sql, variables=variables, **window))
        text = [n for n, t in zip(result.column_names, result.column_types, strict=True)
                if "String" in t.name]
        assert text[0] == "body" and "level" in result.column_names, (name, text)


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def test_compose_provisions_the_chart_dashboards() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    source = "./deploy/helm/primus-safe/dashboards"
    assert any(m.split(":")[0] == source for m in mounts)
    provider = yaml.safe_load(compose["configs"]["grafana-dashboards"]["content"])["providers"][0]
    assert any(m.split(":")[1] == provider["options"]["path"] for m in mounts
               if m.startswith(source))
    assert Path(ROOT / source).is_dir()
