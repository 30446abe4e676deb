"""Writes the event contract as data into ``proto/``: a JSON Schema per event
type, an AsyncAPI 3.0 document naming every channel (subject pattern), its
stream and its message, and the hosts file's JSON Schema (the one input file
other tools write for us). Run ``make proto``; ``tests/test_proto.py`` fails
when the files drift from the models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from libs.bus import STREAMS
from libs.events import EVENT_TYPES, SUBJECT_ROOT, Event, event_type_name
from libs.inventory import render_hosts_schema


def _channel_address(cls: type[Event]) -> str:
    return cls.subject_template.format(root=SUBJECT_ROOT, node="{node}", job="{job}")


def _stream_of(address: str) -> str:
    for spec in STREAMS:
        for pattern in spec.subjects:
            if address.startswith(pattern.removesuffix(">")):
                return spec.name
    raise ValueError(f"no stream holds {address}")


def schemas() -> dict[str, dict[str, Any]]:
    out = {}
    for cls in EVENT_TYPES:
        schema = cls.model_json_schema()
        schema["$id"] = f"https://primus-safe.dev/proto/schemas/{event_type_name(cls)}.json"
        schema["x-subject"] = _channel_address(cls)
        out[event_type_name(cls)] = schema
    return out


def asyncapi() -> dict[str, Any]:
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for cls in EVENT_TYPES:
        name = event_type_name(cls)
        key = name.replace(".", "_")
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
            "x-stream": _stream_of(address),
            **({"parameters": params} if params else {}),
        }
        operations[f"publish_{key}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{key}"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Primus-SaFE events",
            "version": "1",
            "description": "Every fact that crosses the bus. Delivery is at-least-once; "
            "consumers de-duplicate on the event id.",
        },
        "servers": {"nats": {"host": "nats:4222", "protocol": "nats",
                             "description": "NATS with JetStream"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def render() -> dict[str, str]:
    """Relative path -> file content, for writing or comparing."""
    files = {f"schemas/{name}.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
             for name, schema in schemas().items()}
    files["asyncapi.json"] = json.dumps(asyncapi(), indent=2, sort_keys=True) + "\n"
    files["hosts.schema.json"] = render_hosts_schema()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="proto")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "schemas").mkdir(parents=True, exist_ok=True)
    for stale in (out / "schemas").glob("*.json"):
        stale.unlink()
    for rel, text in render().items():
        (out / rel).write_text(text)
    print(f"wrote {len(render())} files to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
