"""proto/ is the contract other teams read: it must match the models."""

from __future__ import annotations

from cli.catalog import ROLES
from libs.proto_gen import render
from tests.helpers import ROOT


def test_proto_matches_the_models() -> None:
    expected = render(ROLES)
    proto = ROOT / "proto"
    on_disk = {str(p.relative_to(proto)): p.read_text() for p in proto.rglob("*.json")}
    stale = sorted(set(on_disk) - set(expected))
    missing = sorted(set(expected) - set(on_disk))
    drifted = sorted(k for k in set(expected) & set(on_disk) if expected[k] != on_disk[k])
    assert not (stale or missing or drifted), (
        f"proto/ drifted from the events and route tables (run `make proto`): stale={stale} "
        f"missing={missing} changed={drifted}")


def test_asyncapi_names_a_stream_for_every_channel() -> None:
    import json

    doc = json.loads(render(ROLES)["asyncapi.json"])
    assert doc["asyncapi"].startswith("3.")
    events = {k: ch for k, ch in doc["channels"].items() if "x-stream" in ch}
    assert all(ch["x-stream"] in {"CONTROL", "TELEMETRY"} for ch in events.values())
    # Heartbeats are the one event no stream keeps: core NATS, and said so.
    beat = doc["channels"]["node_heartbeat"]
    assert beat["address"] == "safe.live.{node}.heartbeat" and "x-stream" not in beat
    assert "outside every stream" in beat["description"]
    # Endpoints are channels too, with their request and reply messages.
    assert doc["channels"]["query_scheduler_admission"]["address"] == \
        "safe.query.scheduler.admission"
    reply = doc["operations"]["scheduler.serves.query_scheduler_admission"]["reply"]
    assert reply["channel"]["$ref"] == "#/channels/query_scheduler_admission_reply"


def test_hosts_schema_is_published_with_the_contract() -> None:
    """`make proto` writes the hosts file's JSON Schema next to the events;
    the drift check above covers it, this pins where and what it is."""
    import json

    from libs.inventory import HostsFile

    text = render(ROLES)["hosts.schema.json"]
    assert (ROOT / "proto" / "hosts.schema.json").read_text() == text
    schema = json.loads(text)
    assert schema["$id"].endswith("/proto/hosts.schema.json")
    assert set(schema["properties"]) == set(HostsFile.model_fields)
    assert {"HostSpec", "KubernetesSettings"} <= set(schema["$defs"])
