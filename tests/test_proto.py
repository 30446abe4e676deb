"""proto/ is the contract other teams read: it must match the models."""

from __future__ import annotations

from libs.proto_gen import render
from tests.helpers import ROOT


def test_proto_matches_the_models() -> None:
    expected = render()
    proto = ROOT / "proto"
    on_disk = {str(p.relative_to(proto)): p.read_text() for p in proto.rglob("*.json")}
    stale = sorted(set(on_disk) - set(expected))
    missing = sorted(set(expected) - set(on_disk))
    drifted = sorted(k for k in set(expected) & set(on_disk) if expected[k] != on_disk[k])
    assert not (stale or missing or drifted), (
        f"proto/ drifted from libs/events.py (run `make proto`): stale={stale} "
        f"missing={missing} changed={drifted}")


def test_asyncapi_names_a_stream_for_every_channel() -> None:
    import json

    doc = json.loads(render()["asyncapi.json"])
    assert doc["asyncapi"].startswith("3.")
    assert all(ch["x-stream"] in {"CONTROL", "TELEMETRY"} for ch in doc["channels"].values())
    assert doc["channels"]["node_heartbeat"]["address"] == "safe.node.{node}.heartbeat"
