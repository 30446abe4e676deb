"""The contract as data, for ``proto/``: a JSON Schema per event type, the
hosts file's JSON Schema, and an AsyncAPI 3.0 document whose channels are
the event subjects and the request/reply endpoints, and whose operations
are the route tables' entries, one each: what every service publishes,
consumes (with its durable, stream and handler), serves, calls and listens
to. Pure: the tables come in as arguments (``cli.catalog`` passes
them and writes the files; ``tests/test_proto.py`` fails on drift)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from libs.events import EVENT_TYPES, SUBJECT_ROOT, Event, event_type_name
from libs.inventory import render_hosts_schema
from libs.routes import Endpoint, Routes, event_subject, health_endpoint
from libs.topology import stream_of


def _channel_address(cls: type[Event]) -> str:
    return cls.subject_template.format(root=SUBJECT_ROOT, node="{node}", job="{job}")


def schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for cls in EVENT_TYPES:
        schema = cls.model_json_schema()
        schema["$id"] = f"https://primus-safe.dev/proto/schemas/{event_type_name(cls)}.json"
        schema["x-subject"] = _channel_address(cls)
        out[event_type_name(cls)] = schema
    return out


def _stream(cls: type[Event]) -> str | None:
    """The stream that keeps ``cls`` events (None: core NATS, liveness)."""
    stream = stream_of(event_subject(cls))
    return None if stream is None else stream.name


def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def event_channel(cls: type[Event]) -> str:
    return _key(event_type_name(cls))


def endpoint_channel(endpoint: Endpoint) -> str:
    name = endpoint.subject.removeprefix(f"{SUBJECT_ROOT}.")
    return _key(re.sub(r"\{[a-z_]+\}", "", name))


def _model_schema(model: type[BaseModel], defs: dict[str, Any]) -> dict[str, Any]:
    """The model's JSON Schema with its definitions moved to ``defs``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs.update(schema.pop("$defs", {}))
    return schema


def operations(tables: Iterable[Routes]) -> dict[str, dict[str, Any]]:
    """One AsyncAPI operation per route-table entry, keyed
    ``<service>.<verb>.<what>`` (verbs: publishes, consumes, serves, calls,
    listens, rereads)."""
    ops: dict[str, dict[str, Any]] = {}

    def add(key: str, op: dict[str, Any]) -> None:
        if key in ops:
            raise ValueError(f"two route entries make the operation {key}")
        ops[key] = op

    for t in tables:
        for cls in t.publishes:
            add(f"{t.service}.publishes.{event_type_name(cls)}", {
                "action": "send", "channel": {"$ref": f"#/channels/{event_channel(cls)}"}})
        for c in t.consumes:
            for o in c.on:
                add(f"{t.service}.consumes.{c.durable}.{event_type_name(o.event)}", {
                    "action": "receive",
                    "channel": {"$ref": f"#/channels/{event_channel(o.event)}"},
                    "summary": c.summary or f"{c.mode} consumer {c.durable}",
                    "x-durable": c.durable, "x-stream": c.stream.name, "x-mode": c.mode,
                    "x-handler": o.handler, "x-leader-only": c.leader})
        served = [(s.endpoint, s.handler) for s in t.serves]
        if t.service_shell:
            served.insert(0, (health_endpoint(t.service), None))
        for endpoint, handler in served:
            op: dict[str, Any] = {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{endpoint_channel(endpoint)}"},
                "summary": endpoint.summary}
            if handler:
                op["x-handler"] = handler
            if endpoint.reply is not None:
                op["reply"] = {"channel": {
                    "$ref": f"#/channels/{endpoint_channel(endpoint)}_reply"}}
            add(f"{t.service}.serves.{endpoint_channel(endpoint)}", op)
        for endpoint in t.calls:
            op = {"action": "send",
                  "channel": {"$ref": f"#/channels/{endpoint_channel(endpoint)}"},
                  "summary": endpoint.summary}
            if endpoint.reply is not None:
                op["reply"] = {"channel": {
                    "$ref": f"#/channels/{endpoint_channel(endpoint)}_reply"}}
            add(f"{t.service}.calls.{endpoint_channel(endpoint)}", op)
        for cls in t.listens:
            add(f"{t.service}.listens.{event_type_name(cls)}", {
                "action": "receive", "channel": {"$ref": f"#/channels/{event_channel(cls)}"},
                "summary": "watched live (a core subscription, no history)"})
        for cls in t.rereads:
            add(f"{t.service}.rereads.{event_type_name(cls)}", {
                "action": "receive", "channel": {"$ref": f"#/channels/{event_channel(cls)}"},
                "summary": "the last one for a key, looked up in its stream"})
    return ops


def asyncapi(tables: Iterable[Routes]) -> dict[str, Any]:
    tables = tuple(tables)
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    defs: dict[str, Any] = {}
    for cls in EVENT_TYPES:
        name = event_type_name(cls)
        key = event_channel(cls)
        address = _channel_address(cls)
        params = {p: {"description": f"{p} name (letters, digits, - or _)"}
                  for p in ("node", "job") if "{" + p + "}" in address}
        messages[key] = {
            "name": name,
            "title": name,
            "summary": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else name,
            "contentType": "application/json",
            "headers": {"type": "object", "properties": {
                "Nats-Msg-Id": {"type": "string", "description": "the event id (de-duplication)"}}},
            "payload": {"$ref": f"schemas/{name}.json"},
        }
        channels[key] = {
            "address": address,
            "messages": {key: {"$ref": f"#/components/messages/{key}"}},
            **({"x-stream": stream} if (stream := _stream(cls)) else
               {"description": "core NATS, outside every stream: liveness, never kept"}),
            **({"parameters": params} if params else {}),
        }
    endpoints: dict[str, Endpoint] = {}
    for t in tables:
        own = [health_endpoint(t.service)] if t.service_shell else []
        for endpoint in [*own, *(s.endpoint for s in t.serves), *t.calls]:
            endpoints.setdefault(endpoint.subject, endpoint)
    for endpoint in sorted(endpoints.values(), key=lambda e: e.subject):
        key = endpoint_channel(endpoint)
        params = {p: {"description": f"the {p}"}
                  for p in re.findall(r"\{([a-z_]+)\}", endpoint.subject)}
        parts = [("request", endpoint.request, key)]
        if endpoint.reply is not None:
            parts.append(("reply", endpoint.reply, f"{key}_reply"))
        for role, model, channel in parts:
            message = f"{key}_{role}"
            payload = (_model_schema(model, defs) if not issubclass(model, Event)
                       else {"$ref": f"schemas/{event_type_name(model)}.json"})
            messages[message] = {"name": message, "title": f"{endpoint.subject} {role}",
                                 "summary": endpoint.summary,
                                 "contentType": "application/json", "payload": payload}
            address = endpoint.subject if role == "request" else None
            channels[channel] = {
                "address": address,
                "messages": {message: {"$ref": f"#/components/messages/{message}"}},
                "description": ("core NATS, outside every stream" if role == "request" else
                                "the requester's reply inbox"),
                **({"parameters": params} if params and role == "request" else {}),
            }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Primus-SaFE events and endpoints",
            "version": "1",
            "description": "Every fact that crosses the bus, and every request/reply "
            "endpoint; operations are the services' route tables. Delivery of events is "
            "at-least-once; consumers de-duplicate on the event id.",
        },
        "servers": {"nats": {"host": "nats:4222", "protocol": "nats",
                             "description": "NATS with JetStream"}},
        "channels": channels,
        "operations": operations(tables),
        "components": {"messages": messages, "schemas": defs},
        "x-services": {t.service: {
            "summary": t.summary,
            "owns": [b.name for b in t.owns], "reads": [b.name for b in t.reads],
            "leases": list(t.leases)} for t in tables},
    }


def render(tables: Iterable[Routes]) -> dict[str, str]:
    """Relative path -> file content, for writing or comparing."""
    files = {f"schemas/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
             for name, schema in schemas().items()}
    files["asyncapi.json"] = json.dumps(asyncapi(tables), indent=2, sort_keys=True) + "\n"
    files["hosts.schema.json"] = render_hosts_schema()
    return files
