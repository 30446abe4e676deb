"""The cluster form of Lens's DDL (``libs.clickhouse_cluster``), on plain text."""

from __future__ import annotations

import pytest

from libs.clickhouse_cluster import ClusterDDLError, Layout, migrations_table, render

LAYOUT = Layout("lens", {"gpu_metrics": "cityHash64(node)", "gpu_1m": "cityHash64(node)"})


def test_a_mergetree_table_becomes_replicated_shards_behind_a_distributed_table() -> None:
    local, distributed = render(
        "CREATE TABLE IF NOT EXISTS p.gpu_metrics (time DateTime, node String) "
        "ENGINE = ReplacingMergeTree(version) ORDER BY (node, time) "
        "SETTINGS non_replicated_deduplication_window = 10000", LAYOUT)
    assert local.startswith("CREATE TABLE IF NOT EXISTS p.gpu_metrics_local ON CLUSTER lens (")
    assert ("ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/p/"
            "gpu_metrics_local', '{replica}', version) ORDER BY (node, time)") in local
    assert "SETTINGS replicated_deduplication_window = 10000" in local
    assert distributed == (
        "CREATE TABLE IF NOT EXISTS p.gpu_metrics ON CLUSTER lens AS p.gpu_metrics_local "
        "ENGINE = Distributed(lens, p, gpu_metrics_local, cityHash64(node))")


def test_column_changes_reach_both_tables_and_indexes_only_the_data() -> None:
    assert render("ALTER TABLE p.gpu_metrics ADD COLUMN IF NOT EXISTS job String", LAYOUT) == [
        "ALTER TABLE p.gpu_metrics_local ON CLUSTER lens ADD COLUMN IF NOT EXISTS job String",
        "ALTER TABLE p.gpu_metrics ON CLUSTER lens ADD COLUMN IF NOT EXISTS job String"]
    assert render("ALTER TABLE p.gpu_metrics ADD INDEX IF NOT EXISTS i job TYPE set(64) "
                  "GRANULARITY 4", LAYOUT) == [
        "ALTER TABLE p.gpu_metrics_local ON CLUSTER lens ADD INDEX IF NOT EXISTS i job "
        "TYPE set(64) GRANULARITY 4"]
    assert render("ALTER TABLE p.ingest MODIFY COMMENT 'x'", LAYOUT) == [
        "ALTER TABLE p.ingest ON CLUSTER lens MODIFY COMMENT 'x'"]


def test_a_rollup_refreshes_per_shard_and_an_insert_view_writes_through() -> None:
    [rollup] = render(
        "CREATE MATERIALIZED VIEW IF NOT EXISTS p.gpu_1m_mv REFRESH EVERY 1 MINUTE APPEND "
        "TO p.gpu_1m AS SELECT node, count() FROM p.gpu_metrics GROUP BY node", LAYOUT)
    assert rollup == (
        "CREATE MATERIALIZED VIEW IF NOT EXISTS p.gpu_1m_mv ON CLUSTER lens REFRESH EVERY "
        "1 MINUTE APPEND TO p.gpu_1m_local AS SELECT node, count() FROM p.gpu_metrics_local "
        "GROUP BY node")
    [feed] = render("CREATE MATERIALIZED VIEW IF NOT EXISTS p.rows TO p.gpu_metrics AS "
                    "SELECT * FROM p.ingest", LAYOUT)
    assert feed == ("CREATE MATERIALIZED VIEW IF NOT EXISTS p.rows ON CLUSTER lens TO "
                    "p.gpu_metrics AS SELECT * FROM p.ingest")


def test_everything_else_runs_on_every_server() -> None:
    assert render("CREATE DATABASE IF NOT EXISTS p", LAYOUT) == [
        "CREATE DATABASE IF NOT EXISTS p ON CLUSTER lens"]
    assert render("CREATE TABLE IF NOT EXISTS p.ingest (a Int8) ENGINE = Null", LAYOUT) == [
        "CREATE TABLE IF NOT EXISTS p.ingest ON CLUSTER lens (a Int8) ENGINE = Null"]
    assert render("DROP VIEW IF EXISTS p.rows", LAYOUT) == [
        "DROP VIEW IF EXISTS p.rows ON CLUSTER lens"]
    assert "ReplicatedReplacingMergeTree('/clickhouse/tables/p/schema_migrations', " \
        "'{replica}')" in migrations_table("p", LAYOUT)


@pytest.mark.parametrize("statement, why", [
    ("CREATE TABLE IF NOT EXISTS p.other (a Int8) ENGINE = MergeTree ORDER BY a",
     "no sharding key"),
    ("CREATE TABLE IF NOT EXISTS p.mem (a Int8) ENGINE = Memory", "no MergeTree or Null"),
    ("INSERT INTO p.gpu_metrics VALUES (1)", "no cluster form"),
    ("CREATE MATERIALIZED VIEW IF NOT EXISTS p.v REFRESH EVERY 1 MINUTE TO p.other AS "
     "SELECT 1", "needs a sharded TO table"),
])
def test_what_cannot_be_placed_on_a_cluster_is_refused(statement: str, why: str) -> None:
    with pytest.raises(ClusterDDLError, match=why):
        render(statement, LAYOUT)


def test_a_cluster_name_is_one_identifier() -> None:
    with pytest.raises(ClusterDDLError, match="cluster name"):
        Layout("lens; DROP DATABASE p", {})
