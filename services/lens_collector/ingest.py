"""Telemetry into ClickHouse as the raw JSON the agents published.

At 100,000 GPUs a second, decoding each message in Python (pydantic, or
even orjson plus appending values) costs more than storing it. So the
collector does not decode telemetry at all: it joins the messages' bytes
into one JSONEachRow payload per kind and inserts it into a Null-engine
``ingest_*`` table whose materialized views (schema migration 5) spread
each node message into ``node_metrics`` and one ``gpu_metrics`` row per GPU.
The engine parses in C++ and checks types, keys and required fields with
CHECK constraints; one insert is one block, so a refused payload stores
nothing.

Before that, each message's envelope is read with two anchored regular
expressions (not a JSON decode): a message of another event type than its
subject's, or of a newer version than this collector reads, is refused at
once, since the engine would store it under the wrong meaning.

When a payload is refused, its messages are validated one by one with the
pydantic contract: the invalid ones come back with pydantic's reason (the
caller dead-letters them) and the rest are inserted again. Messages
delivered before (the collector died before its ack) are first looked up
in the tables and left out when already stored; the de-duplication token
(a hash of the event ids) makes a repeated identical insert a no-op.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from pydantic import ValidationError

from libs.events import (
    SUBJECT_ROOT,
    JobTelemetry,
    LogRecord,
    NodeTelemetry,
    WorkerLog,
    encode_event,
    event_type_name,
    max_version,
    parse_event,
)


@dataclass(frozen=True)
class Route:
    prefix: str  # subject prefix
    table: str  # the ingest table
    event_type: str
    targets: tuple[tuple[str, str, str], ...]  # (table, id column, key column)


ROUTES: tuple[Route, ...] = (
    Route(f"{SUBJECT_ROOT}.telemetry.node.", "ingest_node", event_type_name(NodeTelemetry),
          (("node_metrics", "event_id", "node"), ("gpu_metrics", "event_id", "node"))),
    Route(f"{SUBJECT_ROOT}.telemetry.job.", "ingest_job", event_type_name(JobTelemetry),
          (("job_metrics", "event_id", "job"),)),
    Route(f"{SUBJECT_ROOT}.telemetry.log", "ingest_log", event_type_name(LogRecord),
          (("logs", "id", ""),)),
    Route(f"{SUBJECT_ROOT}.telemetry.output.", "ingest_worker_log", event_type_name(WorkerLog),
          (("logs", "batch", "job"),)),
)
# ClickHouse error codes that mean "this data", not "the store": parse
# errors, type and range errors, a violated CHECK. Anything else (the server
# is away) propagates, so the batch is retried instead of dead-lettered.
DATA_ERRORS = frozenset({6, 25, 26, 27, 32, 38, 41, 43, 53, 69, 70, 72, 117, 131, 321, 349, 469})
_CODE = re.compile(r"Code: (\d+)")
SETTINGS: dict[str, Any] = {
    "date_time_input_format": "best_effort",  # ISO 8601 with Z or an offset
    "input_format_skip_unknown_fields": 1,  # newer optional fields: stored once migrated
    "input_format_json_read_objects_as_strings": 1,  # log fields kept as JSON text
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    # Replacing tables would otherwise merge each inserted block on insert;
    # rows are unique already (redeliveries are filtered), so skip that work.
    "optimize_on_insert": 0,
    # Parsing in parallel threads saves no time on a few cores (it competes
    # with nats-server and the merges) and costs half as much CPU again.
    "input_format_parallel_parsing": 0,
}


@dataclass
class Item:
    """One message to ingest."""

    data: bytes
    event_id: str
    key: str = ""  # node or job, from the subject
    delivered: int = 1
    ref: Any = None  # the caller's handle, handed back when refused


# The envelope's first fields as encode_event writes them (id, type, ... version).
_TYPE = re.compile(rb'^\s*\{\s*"id"\s*:\s*"[^"]{0,128}"\s*,\s*"type"\s*:\s*"([^"]{1,64})"')
_VERSION = re.compile(rb'"version"\s*:\s*(-?\d{1,9})\s*,\s*"data"\s*:')
MAX_ENVELOPE_SCAN = 4096  # the version sits before "data": near the start


def envelope_refusal(route: Route, data: bytes) -> str | None:
    """Why ``data`` must not be stored through ``route`` (its type is
    another one, or its version newer than this code reads), else None.
    Messages in another layout than encode_event's pass here and are
    checked by the contract if the engine refuses them. Pure."""
    head = data[:MAX_ENVELOPE_SCAN]
    kind = _TYPE.match(head)
    if kind is not None and kind.group(1).decode(errors="replace") != route.event_type:
        return (f"a {kind.group(1).decode(errors='replace')} event does not belong on a "
                f"{route.event_type} subject")
    version = _VERSION.search(head)
    newest = max_version(route.event_type)
    if version is not None and newest is not None and int(version.group(1)) > newest:
        return f"{route.event_type} version {int(version.group(1))} not supported (max {newest})"
    return None


def route_of(subject: str) -> Route | None:
    for route in ROUTES:
        if subject.startswith(route.prefix):
            return route
    return None


def store(client: Client, db: str, route: Route, items: Sequence[Item]
          ) -> tuple[int, list[tuple[Any, str]]]:
    """Insert ``items`` through ``route``; (messages stored, [(ref, reason) refused])."""
    refused: list[tuple[Any, str]] = []
    if any(i.delivered > 1 for i in items):
        items = _not_stored(client, db, route, items, only_redelivered=True)
    if not items:
        return 0, refused
    try:
        _insert(client, db, route, items)
        return len(items), refused
    except ClickHouseError as exc:
        _raise_unless_data_error(exc)
    # Refused: find the bad ones with the contract, keep the rest.
    good: list[Item] = []
    for item in items:
        try:
            event = parse_event(item.data)
        except (ValidationError, ValueError) as exc:
            refused.append((item.ref, f"invalid event: {_short(exc)}"))
            continue
        if event.type != route.event_type:
            refused.append((item.ref, f"{event.type} event on a {route.event_type} subject"))
            continue
        good.append(Item(encode_event(event), event.id, item.key, item.delivered, item.ref))
    good = _not_stored(client, db, route, good, only_redelivered=False)
    try:
        if good:
            _insert(client, db, route, good)
        return len(good), refused
    except ClickHouseError as exc:
        _raise_unless_data_error(exc)
    stored = 0
    for item in good:  # valid by the contract, yet the engine refuses it: say why
        try:
            _insert(client, db, route, [item])
            stored += 1
        except ClickHouseError as exc:
            _raise_unless_data_error(exc)
            refused.append((item.ref, f"cannot store: {_short(exc)}"))
    return stored, refused


def event_id_of(data: bytes) -> str:
    """The event id when the message came without a Nats-Msg-Id header."""
    try:
        doc = json.loads(data)
        return str(doc["id"]) if isinstance(doc, dict) and "id" in doc else ""
    except ValueError:
        return ""


def _raise_unless_data_error(exc: ClickHouseError) -> None:
    codes = {int(c) for c in _CODE.findall(_error_text(exc))}
    if not codes & DATA_ERRORS:
        raise exc


def _insert(client: Client, db: str, route: Route, items: Sequence[Item]) -> None:
    token = hashlib.sha256("\n".join(i.event_id for i in items).encode()).hexdigest()
    client.raw_insert(f"{db}.{route.table}", None, b"\n".join(i.data for i in items),
                      settings={**SETTINGS, "insert_deduplication_token": f"{route.table}-{token}"},
                      fmt="JSONEachRow")


def _not_stored(client: Client, db: str, route: Route, items: Sequence[Item], *,
                only_redelivered: bool) -> list[Item]:
    """Leave out what every target table holds already (a crash before the ack)."""
    check = [i for i in items if i.delivered > 1 or not only_redelivered]
    if not check:
        return list(items)
    ids = sorted({i.event_id for i in check})
    keys = sorted({i.key for i in check if i.key})
    times = sorted(t for i in check if (t := _time_of(i.data)))
    # The primary keys lead with node/job and time: narrow by both.
    params: dict[str, Any] = {"ids": ids, "keys": keys,
                              "since": times[0] if times else "1970-01-01 00:00:00",
                              "until": times[-1] if times else "2999-01-01 00:00:00"}
    stored: set[str] | None = None
    for table, id_column, key_column in route.targets:
        where = (f"{id_column} IN {{ids:Array(String)}} AND time >= "
                 "parseDateTime64BestEffort({since:String}, 3, 'UTC') - INTERVAL 1 SECOND "
                 "AND time <= parseDateTime64BestEffort({until:String}, 3, 'UTC') "
                 "+ INTERVAL 1 SECOND")
        if key_column and keys:
            where += f" AND {key_column} IN {{keys:Array(String)}}"
        found = {r[0] for r in client.query(
            f"SELECT DISTINCT {id_column} FROM {db}.{table} WHERE {where}",
            parameters=params).result_rows}
        stored = found if stored is None else stored & found
    return [i for i in items if i.event_id not in (stored or set())]


_TIME = re.compile(rb'"time"\s*:\s*"([^"]{10,40})"')


def _time_of(data: bytes) -> str | None:
    match = _TIME.search(data)
    return match.group(1).decode() if match else None


def _error_text(exc: ClickHouseError) -> str:
    """The engine's message. One that quotes bytes of the payload that are
    not UTF-8 cannot be decoded by the driver, which then raises the
    UnicodeDecodeError instead: its ``object`` still holds the message."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, UnicodeDecodeError):
        return bytes(cause.object).decode(errors="replace")
    return str(exc)


def _short(exc: BaseException) -> str:
    return str(exc).replace("\n", "; ")[:500]
