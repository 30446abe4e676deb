"""Every named query Lens answers runs against the real schema over seeded
data and returns rows; callers can only pick names and typed parameters."""

from __future__ import annotations

import time
from typing import Any

import pytest

from libs.store import open_store
from services.lens_collector.queries import QUERIES, QueryError, resolve
from tests.lens.lens_seed import JOB, NODES, seed

PARAMS: dict[str, dict[str, Any]] = {
    "job_summary": {"job": JOB}, "job_series": {"job": JOB}, "job_attempts": {"job": JOB},
    "job_checkpoints": {"job": JOB}, "job_throughput": {"job": JOB}, "job_gpus": {"job": JOB},
    "node_summary": {"node": NODES[0]}, "node_gpus": {"node": NODES[0]},
    "node_series": {"node": NODES[0]}, "gpu_series": {"node": NODES[0]},
    "alerts": {"job": JOB}, "logs": {"job": JOB}, "timeline": {"job": JOB},
    "worker_logs": {"job": JOB}, "job_output": {"job": JOB},
    "events": {"node": NODES[0]}, "ingest_lag": {"seconds": 600},
    "log_lag_between": {"since_ms": int(time.time() - 3600) * 1000,
                        "until_ms": int(time.time() + 60) * 1000},
    "ingest_lag_between": {"since_ms": int(time.time() - 3600) * 1000,
                           "until_ms": int(time.time() + 60) * 1000},
}


@pytest.fixture(scope="module")
def seeded(clickhouse_dsn: str):  # type: ignore[no-untyped-def]
    database = f"q_{int(time.time())}"
    client = open_store(clickhouse_dsn)
    seed(client, database)
    return client, database


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_named_query_returns_rows(seeded, name: str) -> None:  # type: ignore[no-untyped-def]
    client, database = seeded
    params = {**PARAMS.get(name, {}), **({"database": database}
                                          if "database" in QUERIES[name].params else {})}
    sql, values = resolve(name, params, database)
    result = client.query(sql, parameters=values)
    assert result.result_rows, f"{name} returned nothing"


def test_the_timeline_puts_metrics_events_alerts_and_logs_together(seeded) -> None:  # type: ignore[no-untyped-def]
    client, database = seeded
    sql, values = resolve("timeline", {"job": JOB, "step": 60}, database)
    rows = client.query(sql, parameters=values).result_rows
    kinds = {r[1] for r in rows}
    assert {"metric", "log", "alert", "event"} <= kinds
    times = [r[0] for r in rows]
    assert times == sorted(times)
    sql, values = resolve("timeline", {"node": NODES[1]}, database)
    kinds = {r[1] for r in client.query(sql, parameters=values).result_rows}
    assert {"metric", "log", "alert", "event"} <= kinds


def test_open_alerts_only(seeded) -> None:  # type: ignore[no-untyped-def]
    client, database = seeded
    sql, values = resolve("alerts", {"open_only": 1}, database)
    rules = {r[2] for r in client.query(sql, parameters=values).result_rows}
    assert "gpu_temp_high" not in rules and {"throughput_low", "node_down"} <= rules


def test_only_names_and_typed_parameters() -> None:
    with pytest.raises(QueryError, match="unknown query"):
        resolve("SELECT 1", {}, "db")
    with pytest.raises(QueryError, match="takes no parameter"):
        resolve("timeline", {"job": "j", "sql": "DROP TABLE x"}, "db")
