"""The ingest path against the real engine (chDB): raw telemetry JSON in,
the same rows as the reference (``rows_for``) out; bad messages refused with
the contract's reason while the rest are stored; redeliveries never add a
row twice; an existing database upgrades in place."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import OperationalError

from libs.events import (
    COLUMNAR,
    GpuMetrics,
    JobTelemetry,
    JobTelemetryData,
    LogRecord,
    LogRecordData,
    NodeTelemetry,
    encode_event,
)
from libs.store import migrate
from services.lens_collector.ingest import ROUTES, Item, store
from services.lens_collector.rollups import backfill
from services.lens_collector.rows import COLUMNS, rows_for
from services.lens_collector.schema import MIGRATIONS
from tests.lens.lens_seed import node_event

NODE, JOB, LOG, _OUTPUT = ROUTES


def v1_json(event: NodeTelemetry, **update: Any) -> dict[str, Any]:
    """The message as a version 1 agent sent it: one object per GPU and NIC."""
    doc = {**json.loads(encode_event(event)), "version": 1, **update}
    for field, (wire, _, _) in COLUMNAR.items():
        doc["data"].pop(wire, None)
        doc["data"][field] = [item.model_dump(mode="json", exclude_none=True)
                              for item in getattr(event.data, field)]
    return doc


def items(events: list[Any], delivered: int = 1) -> list[Item]:
    return [Item(encode_event(e), e.id, e.node or e.job or "", delivered, ref=e.id)
            for e in events]


def table(client, db: str, name: str) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    cols = ", ".join(COLUMNS[name])
    key = "event_id" if "event_id" in COLUMNS[name] else "id"
    extra = ", gpu" if name == "gpu_metrics" else ""
    return client.query(f"SELECT {cols} FROM {db}.{name} ORDER BY {key}{extra}").result_rows


def norm(value: Any) -> Any:
    if isinstance(value, datetime):  # the tables keep milliseconds
        return value.replace(tzinfo=None, microsecond=value.microsecond // 1000 * 1000)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else round(value, 3)
    if isinstance(value, dict):
        return {k: norm(v) for k, v in sorted(value.items())}
    return value


def test_engine_rows_equal_the_reference_rows(client, db: str) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    nodes = [node_event(f"n{i}", now, i) for i in range(3)]
    jobs = [JobTelemetry(source="sdk", job="j1", node="n1", data=JobTelemetryData(
        rank=r, iteration=7, loss=0.5, throughput=10.0, grad_norm=2.0, tokens_per_s=99.0))
        for r in range(2)]
    jobs.append(JobTelemetry(source="sdk", job="j1", data=JobTelemetryData(
        rank=0, iteration=8, loss_nonfinite="-inf", checkpoint_path="/c/8", checkpoint_bytes=5,
        checkpoint_duration_s=1.5)))
    logs = [LogRecord(source="svc", node="n1", job="j1", data=LogRecordData(
        level="error", message="boom", service="scheduler", fields={"a": [1, 2], "b": "x"}))]
    for route, events in ((NODE, nodes), (JOB, jobs), (LOG, logs)):
        stored, refused = store(client, db, route, items(events))
        assert (stored, refused) == (len(events), [])
    # Agents not yet upgraded send version 1 (GPUs as objects): the same rows.
    old = [node_event(f"old{i}", now, i) for i in range(2)]
    assert store(client, db, NODE, [Item(json.dumps(v1_json(e)).encode(), e.id, e.node or "")
                                    for e in old]) == (2, [])
    nodes += old
    expected = rows_for([(e, 0) for e in nodes + jobs + logs])
    for name in ("node_metrics", "gpu_metrics", "job_metrics", "logs"):
        got = [[norm(v) for v in row] for row in table(client, db, name)]
        key = COLUMNS[name].index("event_id" if "event_id" in COLUMNS[name] else "id")
        want = sorted(([norm(v) for v in row] for row in expected[name]),
                      key=lambda r: (r[key], r[2] if name == "gpu_metrics" else 0))
        if name == "logs":  # the engine keeps the JSON text as sent
            got = [r[:-1] for r in got]
            want = [r[:-1] for r in want]
        assert got == want, name
    losses = {r[0] for r in client.query(f"SELECT toString(loss) FROM {db}.job_metrics")
              .result_rows}
    assert "-inf" in losses


def test_a_bad_message_is_refused_with_its_reason_and_the_rest_stored(client, db: str) -> None:  # type: ignore[no-untyped-def]
    good = [node_event(f"n{i}", datetime.now(UTC), i) for i in range(3)]
    batch = items(good)
    batch.insert(1, Item(b'{"type":"telemetry.node","id":"b1","time":"2026-01-01T00:00:00Z",'
                         b'"source":"x","node":"n9","data":{"cpu_pct":"hot"}}', "b1", ref="b1"))
    batch.insert(2, Item(b"not json", "b2", ref="b2"))
    wrong_kind = JobTelemetry(source="sdk", job="j1", data=JobTelemetryData(rank=0, iteration=1))
    batch.append(Item(encode_event(wrong_kind), wrong_kind.id, ref="b3"))
    no_gpu_index = json.loads(encode_event(good[0]))
    no_gpu_index["id"] = "b4"
    del no_gpu_index["data"]["gpu_columns"]["index"]
    batch.append(Item(json.dumps(no_gpu_index).encode(), "b4", ref="b4"))
    short_column = json.loads(encode_event(good[1]))
    short_column["id"] = "b5"
    short_column["data"]["gpu_columns"]["temp_c"].pop()
    batch.append(Item(json.dumps(short_column).encode(), "b5", ref="b5"))
    v1_without_index = v1_json(good[2], id="b6")
    del v1_without_index["data"]["gpus"][0]["index"]
    batch.append(Item(json.dumps(v1_without_index).encode(), "b6", ref="b6"))
    nic_without_rate = json.loads(encode_event(good[0]))
    nic_without_rate["id"] = "b7"
    del nic_without_rate["data"]["nic_columns"]["tx_bytes_s"]
    batch.append(Item(json.dumps(nic_without_rate).encode(), "b7", ref="b7"))
    stored, refused = store(client, db, NODE, batch)
    assert stored == 3
    reasons = dict(refused)
    assert set(reasons) == {"b1", "b2", "b3", "b4", "b5", "b6", "b7"}
    assert "tx_bytes_s" in reasons["b7"] and "Field required" in reasons["b7"]
    assert "cpu_pct" in reasons["b1"] and "Invalid JSON" in reasons["b2"]
    assert "telemetry.job event on a telemetry.node subject" in reasons["b3"]
    assert "the index array" in reasons["b4"]
    assert "gpu_columns.temp_c must be an array of 4 values" in reasons["b5"]
    assert "index" in reasons["b6"] and "Field required" in reasons["b6"]
    assert client.query(f"SELECT count() FROM {db}.node_metrics").result_rows[0][0] == 3


def test_redeliveries_never_store_a_row_twice(client, db: str) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    first = [node_event(f"n{i}", now - timedelta(seconds=i), i) for i in range(4)]
    later = [node_event(f"n{i}", now + timedelta(seconds=1), i) for i in range(4)]
    assert store(client, db, NODE, items(first)) == (4, [])
    # The same batch again (same token) and a batch that overlaps it (new token).
    assert store(client, db, NODE, items(first, delivered=2))[0] == 0
    assert store(client, db, NODE, items(first[2:] + later, delivered=2))[0] == 4
    counts = client.query(f"SELECT count(), uniqExact(event_id, gpu) FROM {db}.gpu_metrics"
                          ).result_rows[0]
    assert counts == (8 * 4, 8 * 4)
    assert client.query(f"SELECT count() FROM {db}.node_metrics").result_rows[0][0] == 8


def test_a_store_that_is_away_is_not_a_bad_message(db: str) -> None:
    class Away:
        def raw_insert(self, *a: object, **k: object) -> None:
            raise OperationalError("Code: 210. Connection refused")

        def query(self, *a: object, **k: object) -> None:
            raise OperationalError("Code: 210. Connection refused")

    with pytest.raises(OperationalError):  # retried later, never dead-lettered
        store(Away(), db, NODE, items([node_event("n1", datetime.now(UTC), 0)]))  # type: ignore[arg-type]


def test_an_existing_database_upgrades_in_place(client, database: str) -> None:  # type: ignore[no-untyped-def]
    migrate(client, database, MIGRATIONS[:1])  # as it shipped before Lens grew
    old = NodeTelemetry(source="a", node="n1", data=node_event("n1", datetime.now(UTC), 0).data
                        .model_copy(update={"gpus": [GpuMetrics(index=0, temp_c=50.0)]}))
    v1 = [c for c in COLUMNS["gpu_metrics"] if c in (
        "time", "node", "gpu", "event_id", "util_pct", "vram_used_bytes", "vram_total_bytes",
        "temp_c", "power_w")]
    row = rows_for([(old, 0)])["gpu_metrics"][0]
    client.insert(f"{database}.gpu_metrics", [[row[COLUMNS["gpu_metrics"].index(c)] for c in v1]],
                  column_names=v1)
    applied = migrate(client, database, MIGRATIONS)
    assert applied == [m.version for m in MIGRATIONS[1:]]
    rows = client.query(f"SELECT temp_c, temp_junction_c, received FROM {database}.gpu_metrics"
                        ).result_rows
    assert rows[0][0] == 50.0 and rows[0][1] is None  # old rows kept, new columns NULL


def test_rollups_are_refreshable_views_and_backfill_fills_them(client, db: str) -> None:  # type: ignore[no-untyped-def]
    views = {r[0] for r in client.query(
        "SELECT name FROM system.tables WHERE database = {d:String} AND engine = "
        "'MaterializedView'", parameters={"d": db}).result_rows}
    assert {"gpu_metrics_1m_mv", "node_metrics_1m_mv", "job_metrics_1m_mv"} <= views
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=3)
    events = [node_event("n1", start + timedelta(seconds=10 * k), k) for k in range(12)]
    store(client, db, NODE, items(events))
    backfill(client, db, start, start + timedelta(minutes=2))
    backfill(client, db, start, start + timedelta(minutes=2))  # again: replaced, not doubled
    rows = client.query(f"SELECT minute, gpu, samples, util_avg FROM {db}.gpu_metrics_1m FINAL "
                        "WHERE gpu = 0 ORDER BY minute").result_rows
    assert [r[2] for r in rows] == [6, 6]
