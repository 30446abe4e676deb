"""Lens's DDL for a ClickHouse cluster: shards of replicas, one schema.

On one server every statement runs as written. On a cluster
(``PRIMUS_CLICKHOUSE_CLUSTER``, the name in the servers' ``remote_servers``)
each statement is rendered (pure text in, text out) into what a sharded,
replicated layout needs:

- a MergeTree table ``T`` becomes ``T_local`` on every server
  (``Replicated*MergeTree`` under ``/clickhouse/tables/{shard}/<db>/T_local``,
  replica ``{replica}``, from the servers' macros) plus ``T``, a
  ``Distributed`` table over them sharded by ``Layout.sharding[T]``. Every
  query, dashboard and insert keeps naming ``T``: rows go to the shard their
  key says, so a redelivered row lands beside its first copy and
  ReplacingMergeTree merges the two there;
- a column change goes to both tables, an index or TTL to the local one;
- a view refreshed on a timer (a roll-up) runs on every replica over its
  own shard (``FROM S_local``, ``TO T_local``), which is whole because each
  roll-up's source is sharded by a column it groups by; a view fed by
  inserts keeps writing to the ``Distributed`` table;
- everything else (the database, Null-engine ingest tables, drops) runs
  ``ON CLUSTER``.

A statement of a kind not listed here is refused (``ClusterDDLError``)
rather than run on one server only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

LOCAL = "_local"


class ClusterDDLError(ValueError):
    """A statement this renderer cannot place on a cluster."""


@dataclass(frozen=True)
class Layout:
    cluster: str
    sharding: Mapping[str, str]  # MergeTree table -> its sharding key expression

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.cluster):
            raise ClusterDDLError(f"cluster name {self.cluster!r}: use letters, digits and _")

    @property
    def on(self) -> str:
        return f" ON CLUSTER {self.cluster}"


def data_table(name: str, layout: Layout | None) -> str:
    """The table that holds ``name``'s rows (and its TTL, its indexes): the
    shard's ``<name>_local`` on a cluster, the table itself on one server."""
    return f"{name}{LOCAL}" if layout is not None and name in layout.sharding else name


_NAME = r"(?P<db>\w+)\.(?P<name>\w+)"
_CREATE_TABLE = re.compile(rf"^\s*CREATE TABLE IF NOT EXISTS {_NAME}\s*\(", re.S)
_ENGINE = re.compile(r"\bENGINE\s*=\s*(?P<engine>\w*MergeTree|Null)\b(?:\((?P<args>[^)]*)\))?")
_ALTER = re.compile(rf"^\s*ALTER TABLE {_NAME}\b", re.S)
_VIEW = re.compile(rf"^\s*CREATE MATERIALIZED VIEW IF NOT EXISTS {_NAME}\b", re.S)
_TO = re.compile(r"\bTO (?P<db>\w+)\.(?P<name>\w+)\b")
_DROP = re.compile(rf"^\s*DROP (?:TABLE|VIEW) IF EXISTS {_NAME}\s*$", re.S)
_DATABASE = re.compile(r"^\s*CREATE DATABASE IF NOT EXISTS (?P<db>\w+)\s*$", re.S)
_COLUMN_CHANGE = re.compile(r"\b(?:ADD|MODIFY|DROP|RENAME|COMMENT) COLUMN\b")


def render(statement: str, layout: Layout) -> list[str]:
    """``statement`` (its database already filled in) as the statements a
    cluster runs, in order."""
    on = layout.on
    if m := _DATABASE.match(statement):
        return [statement.rstrip() + on]
    if m := _CREATE_TABLE.match(statement):
        return _create_table(statement, m, layout)
    if m := _ALTER.match(statement):
        db, name = m["db"], m["name"]
        if name not in layout.sharding:
            return [_after(statement, m, on)]
        local = _after(statement, m, on, rename=f"{db}.{data_table(name, layout)}")
        if _COLUMN_CHANGE.search(statement):  # the Distributed table shows the columns
            return [local, _after(statement, m, on)]
        return [local]  # an index, a TTL, a setting: the data's own table
    if m := _VIEW.match(statement):
        return [_view(statement, m, layout)]
    if m := _DROP.match(statement):
        return [statement.rstrip() + on]
    raise ClusterDDLError(f"no cluster form for this statement: {statement.strip()[:120]}")


def migrations_table(database: str, layout: Layout) -> str:
    """The migrations' bookkeeping: one copy on every server of the cluster
    (no ``{shard}`` in the path), so any collector sees what was applied."""
    return (f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations{layout.on} "
            "(version UInt32, name String, "
            "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
            f"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{database}/"
            "schema_migrations', '{replica}') ORDER BY version")


def _after(statement: str, m: re.Match[str], on: str, rename: str | None = None) -> str:
    """``statement`` with ``ON CLUSTER`` after its table name (renamed)."""
    name = rename or f"{m['db']}.{m['name']}"
    return statement[:m.start("db")] + name + on + statement[m.end("name"):]


def _create_table(statement: str, m: re.Match[str], layout: Layout) -> list[str]:
    db, name = m["db"], m["name"]
    on = layout.on
    engine = _ENGINE.search(statement)
    if engine is None:
        raise ClusterDDLError(f"{db}.{name}: no MergeTree or Null engine to place on a cluster")
    if engine["engine"] == "Null":  # takes inserts, keeps nothing: on every server
        return [_after(statement, m, on)]
    if name not in layout.sharding:
        raise ClusterDDLError(f"{db}.{name}: no sharding key; add it to the layout")
    local = data_table(name, layout)
    path = f"'/clickhouse/tables/{{shard}}/{db}/{local}', '{{replica}}'"
    args = f"{path}, {engine['args']}" if engine["args"] else path
    replicated = (statement[:engine.start()] + f"ENGINE = Replicated{engine['engine']}({args})"
                  + statement[engine.end():])
    replicated = replicated.replace("non_replicated_deduplication_window",
                                    "replicated_deduplication_window")
    distributed = (f"CREATE TABLE IF NOT EXISTS {db}.{name}{on} AS {db}.{local} "
                   f"ENGINE = Distributed({layout.cluster}, {db}, {local}, "
                   f"{layout.sharding[name]})")
    return [_after(replicated, m, on, rename=f"{db}.{local}"), distributed]


def _view(statement: str, m: re.Match[str], layout: Layout) -> str:
    rendered = _after(statement, m, layout.on)
    if not re.search(r"\bREFRESH\b", statement):
        return rendered  # fed by inserts: writes through the Distributed table
    head, sep, body = rendered.partition(" AS ")
    target = _TO.search(head)
    if not sep or target is None or target["name"] not in layout.sharding:
        raise ClusterDDLError(f"{m['db']}.{m['name']}: a refreshed view needs a sharded "
                              "TO table to run per shard")
    head = head[:target.end()] + LOCAL + head[target.end():]
    sharded = "|".join(map(re.escape, sorted(layout.sharding, key=len, reverse=True)))
    body = re.sub(rf"\b({re.escape(m['db'])})\.({sharded})\b", rf"\1.\2{LOCAL}", body)
    return head + sep + body
