"""ClickHouse access: one client factory for the in-process engine
(``chdb:///abs/path``) and a server (``http(s)://user:pw@host:8123``), and
versioned, idempotent schema migrations applied at start-up.

clickhouse-connect's client is synchronous; async services call it through
``asyncio.to_thread``. Only one chDB engine may live in a process, and one
process per path, so exactly one service (lens-collector) opens the store in
the embedded stack; everyone else asks it over the bus.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from libs.clickhouse_cluster import Layout, migrations_table, render
from libs.logs import get_logger


class StoreConfigError(ValueError):
    pass


def open_store(dsn: str) -> Client:
    """Open a client for ``chdb:///abs/path`` or ``http(s)://...:8123``."""
    scheme = urlparse(dsn).scheme
    if scheme == "chdb":
        path = dsn.removeprefix("chdb://")
        if not path.startswith("/"):
            raise StoreConfigError(
                f"PRIMUS_CLICKHOUSE_DSN={dsn!r}: the chDB path must be absolute, "
                "e.g. chdb:///var/lib/primus/clickhouse"
            )
        Path(path).mkdir(parents=True, exist_ok=True)
        return clickhouse_connect.get_client(dsn=dsn)
    if scheme in ("http", "https"):
        return clickhouse_connect.get_client(dsn=dsn)
    raise StoreConfigError(
        f"PRIMUS_CLICKHOUSE_DSN={dsn!r}: unknown scheme {scheme!r}; "
        "use chdb:///abs/path or http(s)://user:password@host:8123"
    )


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def cluster_statements(statement: str, database: str, layout: Layout | None) -> list[str]:
    """``statement`` with its database filled in, rendered for ``layout``'s
    cluster when there is one (``libs.clickhouse_cluster``)."""
    sql = statement.format(db=database)
    return render(sql, layout) if layout is not None else [sql]


def migrate(client: Client, database: str, migrations: tuple[Migration, ...],
            layout: Layout | None = None) -> list[int]:
    """Apply migrations not yet recorded; returns the versions applied now.

    Each statement is written to be idempotent (IF NOT EXISTS), so a crash
    between a statement and its bookkeeping row is repaired by the next run.
    With ``layout`` every statement runs in its cluster form, ON CLUSTER.
    """
    log = get_logger(component="store")
    for sql in cluster_statements("CREATE DATABASE IF NOT EXISTS {db}", database, layout):
        client.command(sql)
    client.command(migrations_table(database, layout) if layout is not None else (
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations "
        "(version UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = ReplacingMergeTree ORDER BY version"))
    done = {
        row[0]
        for row in client.query(f"SELECT version FROM {database}.schema_migrations").result_rows
    }
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions) or versions != sorted(versions):
        raise StoreConfigError("migration versions must be unique and increasing")
    applied = []
    for migration in migrations:
        if migration.version in done:
            continue
        for statement in migration.statements:
            for sql in cluster_statements(statement, database, layout):
                client.command(sql)
        client.insert(
            f"{database}.schema_migrations",
            [[migration.version, migration.name]],
            column_names=["version", "name"],
        )
        applied.append(migration.version)
        log.info("migration applied", version=migration.version, name=migration.name)
    return applied
