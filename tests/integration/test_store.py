"""Store against the real ClickHouse engine (chDB): migrations are versioned
and idempotent; rows land once even when a batch is inserted twice."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest

from libs.events import (
    GpuMetrics,
    HeartbeatData,
    JobTelemetry,
    JobTelemetryData,
    NodeHeartbeat,
    NodeTelemetry,
    NodeTelemetryData,
)
from libs.store import Migration, StoreConfigError, migrate, open_store
from services.lens_collector.queries import QueryError, resolve
from services.lens_collector.rows import COLUMNS, rows_for
from services.lens_collector.schema import MIGRATIONS


@pytest.fixture(scope="module")
def client(clickhouse_dsn: str):  # type: ignore[no-untyped-def]
    return open_store(clickhouse_dsn)


def test_migrations_apply_once(client, database: str) -> None:  # type: ignore[no-untyped-def]
    versions = [m.version for m in MIGRATIONS]
    assert migrate(client, database, MIGRATIONS) == versions
    assert migrate(client, database, MIGRATIONS) == []
    tables = {r[0] for r in client.query(f"SHOW TABLES FROM {database}").result_rows}
    assert {"events", "node_metrics", "gpu_metrics", "job_metrics", "schema_migrations"} <= tables
    nxt = versions[-1] + 1
    extra = (*MIGRATIONS, Migration(nxt, "add a column", (
        "ALTER TABLE {db}.events ADD COLUMN IF NOT EXISTS note String DEFAULT ''",)))
    assert migrate(client, database, extra) == [nxt]
    stored = client.query(f"SELECT version FROM {database}.schema_migrations FINAL "
                          "ORDER BY version").result_rows
    assert stored == [(v,) for v in [*versions, nxt]]


def test_migrations_must_increase(client, database: str) -> None:  # type: ignore[no-untyped-def]
    bad = (Migration(2, "b", ()), Migration(1, "a", ()))
    with pytest.raises(StoreConfigError, match="unique and increasing"):
        migrate(client, database, bad)


def test_bad_dsn_is_explained() -> None:
    with pytest.raises(StoreConfigError, match="must be absolute"):
        open_store("chdb://relative/path")
    with pytest.raises(StoreConfigError, match="unknown scheme 'mysql'"):
        open_store("mysql://x")


def test_rows_land_once_even_when_a_batch_is_redelivered(client, database: str) -> None:  # type: ignore[no-untyped-def]
    migrate(client, database, MIGRATIONS)
    batch = [
        (NodeHeartbeat(source="a", node="n1", data=HeartbeatData(seq=1, pid=1, interval_s=1)), 1),
        (NodeTelemetry(source="a", node="n1", data=NodeTelemetryData(
            cpu_pct=10, mem_used_bytes=1, mem_total_bytes=2, load1=0.5,
            gpus=[GpuMetrics(index=0, temp_c=50.0), GpuMetrics(index=1, temp_c=55.0)])), 2),
        (JobTelemetry(source="sdk", job="j1", node="n1", data=JobTelemetryData(
            rank=0, iteration=7, loss=1.5)), 3),
    ]
    tables = rows_for(batch)
    assert {t: len(r) for t, r in tables.items()} == {
        "events": 1, "node_metrics": 1, "gpu_metrics": 2, "job_metrics": 1}
    for _ in range(2):  # a redelivery inserts the same rows again
        for table, rows in tables.items():
            client.insert(f"{database}.{table}", rows, column_names=COLUMNS[table],
                          settings={"insert_deduplication_token": f"{table}-tok"})
    counts = {t: client.query(f"SELECT count() FROM {database}.{t}").result_rows[0][0]
              for t in tables}
    assert counts == {"events": 1, "node_metrics": 1, "gpu_metrics": 2, "job_metrics": 1}
    sql, params = resolve("job_summary", {"job": "j1"}, database)
    row = client.query(sql, parameters=params).result_rows[0]
    assert row[0] == 1 and row[2] == 7 and row[4] == 1.5
    t = client.query(f"SELECT time FROM {database}.events").result_rows[0][0]
    # Naive times from the engine are UTC, to the millisecond.
    assert abs(t.replace(tzinfo=UTC) - batch[0][0].time) < timedelta(milliseconds=1)


def test_only_named_queries_with_known_parameters_run() -> None:
    with pytest.raises(QueryError, match="unknown query 'drop_everything'"):
        resolve("drop_everything", {}, "db")
    with pytest.raises(QueryError, match="needs parameter"):
        resolve("job_summary", {}, "db")
    with pytest.raises(QueryError, match="takes no parameter"):
        resolve("job_summary", {"job": "j", "sql": "x"}, "db")
