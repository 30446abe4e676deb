"""Lens's schema in its ClickHouse cluster form (``PRIMUS_CLICKHOUSE_CLUSTER``):
every statement of every migration, rendered for a cluster, is parsed by the
real engine (chDB's ``formatQuery``: no cluster runs here); every MergeTree
table the schema makes has a sharding key; and the queries of the CLI and
the dashboards name only tables that are Distributed on a cluster, never a
shard's ``_local`` table."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from libs.clickhouse_cluster import LOCAL, Layout
from libs.store import cluster_statements
from services.lens_collector.queries import QUERIES
from services.lens_collector.schema import MIGRATIONS, SHARDING
from tests.helpers import ROOT

DASHBOARDS = ROOT / "deploy" / "helm" / "primus-safe" / "dashboards"
LAYOUT = Layout("primus_cluster", SHARDING)


def parses(client: Any, sql: str) -> str:
    return client.query("SELECT formatQuery({q:String})", parameters={"q": sql}).result_rows[0][0]


def test_every_migration_parses_in_its_cluster_form(client: Any) -> None:
    rendered = [sql for m in MIGRATIONS for s in m.statements
                for sql in cluster_statements(s, "primus", LAYOUT)]
    assert len(rendered) > sum(len(m.statements) for m in MIGRATIONS)  # local + Distributed
    for sql in rendered:
        text = parses(client, sql)
        assert "ON CLUSTER primus_cluster" in text, sql[:200]
    distributed = [s for s in rendered if "ENGINE = Distributed(" in s]
    assert len(distributed) == len(SHARDING)
    # The check can fail: a statement the engine cannot parse is refused.
    with pytest.raises(Exception, match="Syntax error"):
        parses(client, rendered[1].replace("(", "((", 1))


def test_every_mergetree_table_has_a_sharding_key(client: Any, db: str) -> None:
    tables = {name for name, engine in client.query(
        "SELECT name, engine FROM system.tables WHERE database = {d:String}",
        parameters={"d": db}).result_rows
        if engine.endswith("MergeTree") and name != "schema_migrations"}
    assert tables == set(SHARDING)


def _tables(sql: str) -> set[str]:
    """Tables a query reads: FROM / JOIN a name (not a subquery, a function
    such as ARRAY JOIN's, or a system table)."""
    return {m.group(1) for m in re.finditer(
        r"\b(?:FROM|JOIN)\s+(?:\{db\}\.|\$\{database\}\.)?([A-Za-z_]\w*)\b(?!\.)(?!\s*\()",
        sql)}


def test_queries_and_dashboards_read_only_distributed_tables() -> None:
    named: dict[str, set[str]] = {f"query {n}": _tables(q.sql) for n, q in QUERIES.items()}
    for path in DASHBOARDS.glob("*.json"):
        for raw in re.findall(r'"rawSql":\s*("(?:[^"\\]|\\.)*")',
                              path.read_text()):
            named[f"{path.name}: {json.loads(raw)[:60]}"] = _tables(json.loads(raw))
    allowed = set(SHARDING)
    seen = set().union(*named.values())
    assert {"gpu_metrics", "events", "job_metrics"} <= seen  # the scan finds names at all
    wrong = {where: sorted(t for t in tables if t not in allowed or t.endswith(LOCAL))
             for where, tables in named.items()}
    assert not {w: t for w, t in wrong.items() if t}, wrong
