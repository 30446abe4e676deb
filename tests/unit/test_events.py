"""The event contract: every type round-trips, subjects follow
safe.<domain>.<key>.<verb>, and bad input is refused with a reason."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from libs.events import (
    EVENT_TYPES,
    BenchResult,
    BenchResultData,
    Figure,
    GpuMetrics,
    HeartbeatData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    NicMetrics,
    NodeHeartbeat,
    NodeTelemetry,
    NodeTelemetryData,
    UnknownEventType,
    UnsupportedVersion,
    encode_event,
    event_type_name,
    parse_event,
    read_event,
)

SPEC = JobSpec(name="j", workers=2, command=["python", "x.py"])


def test_every_event_type_is_named_by_its_type_field() -> None:
    names = [event_type_name(cls) for cls in EVENT_TYPES]
    assert len(set(names)) == len(names)
    assert {"node.registered", "node.heartbeat", "bench.request", "bench.result",
            "job.submitted", "job.placed", "worker.started", "worker.exited",
            "job.completed", "telemetry.node", "telemetry.job", "fault.opened"} <= set(names)


def test_round_trip_keeps_type_and_fields() -> None:
    event = BenchResult(source="bench-agent/n1", node="n1", data=BenchResultData(
        level="quick", passed=True, device="cpu", device_count=1, duration_s=0.5,
        figures=[Figure(name="gemm", value=0.1, unit="TFLOPS")]))
    back = parse_event(encode_event(event))
    assert isinstance(back, BenchResult)
    assert back == event
    assert back.subject == "safe.bench.n1.result"


def test_subjects_follow_the_contract() -> None:
    hb = NodeHeartbeat(source="a", node="gpu-07", data=HeartbeatData(seq=1, pid=1, interval_s=1))
    job = JobSubmitted(source="cli", job="j-42", data=JobSubmittedData(spec=SPEC))
    assert hb.subject == "safe.live.gpu-07.heartbeat"
    assert job.subject == "safe.job.j-42.submitted"


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "", "-x"])
def test_keys_that_would_break_subjects_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="not a valid name"):
        NodeHeartbeat(source="a", node=bad, data=HeartbeatData(seq=1, pid=1, interval_s=1))


def test_unknown_type_and_missing_fields_fail_validation() -> None:
    with pytest.raises(UnknownEventType, match="field 'type': 'node.exploded' is not an event"):
        parse_event(json.dumps({"type": "node.exploded", "source": "x", "data": {}}))
    with pytest.raises(UnknownEventType, match="field 'type' is missing"):
        parse_event(json.dumps({"source": "x", "data": {}}))
    with pytest.raises(ValidationError):
        parse_event(json.dumps({"type": "node.heartbeat", "source": "x", "node": "n",
                                "data": {"seq": 1}}))
    with pytest.raises(ValidationError):
        parse_event(b"not json")


def test_naive_times_are_taken_as_utc() -> None:
    event = parse_event(json.dumps({
        "type": "node.heartbeat", "source": "x", "node": "n", "time": "2026-01-01T00:00:00",
        "data": {"seq": 1, "pid": 2, "interval_s": 1.0}}))
    assert event.time.utcoffset() is not None and event.time.utcoffset().total_seconds() == 0


def test_events_are_immutable() -> None:
    hb = NodeHeartbeat(source="a", node="n", data=HeartbeatData(seq=1, pid=1, interval_s=1))
    with pytest.raises(ValidationError):
        hb.node = "other"  # type: ignore[misc]


def _node(gpus: list[GpuMetrics], nics: list[NicMetrics] | None = None) -> NodeTelemetry:
    return NodeTelemetry(source="bench-agent/n1", node="n1", data=NodeTelemetryData(
        cpu_pct=1.0, mem_used_bytes=1, mem_total_bytes=2, load1=0.5, gpus=gpus,
        nics=nics or []))


def test_node_gpus_travel_as_columns_and_rows_are_still_read() -> None:
    event = _node([GpuMetrics(index=0, util_pct=90.0, temp_c=70.0),
                   GpuMetrics(index=1, util_pct=None, temp_c=71.0)],
                  [NicMetrics(name="eth0", rx_bytes_s=1.0, tx_bytes_s=2.0),
                   NicMetrics(name="mlx5_0/1", rx_bytes_s=3.0, tx_bytes_s=4.0, rdma=True)])
    wire = json.loads(encode_event(event))
    assert wire["version"] == 2 and "gpus" not in wire["data"] and "nics" not in wire["data"]
    # One array per reading some GPU has; None where this GPU lacks it.
    assert wire["data"]["gpu_columns"] == {"index": [0, 1], "util_pct": [90.0, None],
                                           "temp_c": [70.0, 71.0]}
    assert wire["data"]["nic_columns"] == {"name": ["eth0", "mlx5_0/1"], "rx_bytes_s": [1.0, 3.0],
                                           "tx_bytes_s": [2.0, 4.0], "rdma": [False, True]}
    assert parse_event(encode_event(event)) == event
    v1 = {**wire, "version": 1, "data": {**{k: v for k, v in wire["data"].items()
                                             if not k.endswith("_columns")},
                                          "gpus": [{"index": 0, "util_pct": 90.0, "temp_c": 70.0},
                                                   {"index": 1, "temp_c": 71.0}],
                                          "nics": [n.model_dump() for n in event.data.nics]}}
    assert parse_event(json.dumps(v1)).data == event.data  # version 1 agents keep working
    no_gpus = json.loads(encode_event(_node([])))
    assert "gpu_columns" not in no_gpus["data"] and "nic_columns" not in no_gpus["data"]
    assert parse_event(json.dumps(no_gpus)).data.gpus == []


@pytest.mark.parametrize(("columns", "reason"), [
    ({"index": [0, 1], "temp_c": [70.0]}, "gpu_columns.temp_c must be an array of 2 values"),
    ({"temp_c": [70.0]}, "with the index array"),
    ({"index": [0], "fan_rpm": [1]}, "fan_rpm"),
])
def test_bad_gpu_columns_are_refused_with_a_reason(columns: dict[str, list[float]],
                                                    reason: str) -> None:
    wire = json.loads(encode_event(_node([])))
    wire["data"]["gpu_columns"] = columns
    with pytest.raises(ValidationError, match=reason):
        parse_event(json.dumps(wire))
    both = {**wire, "data": {**wire["data"], "gpus": [{"index": 0}]}}
    with pytest.raises(ValidationError, match="not both"):
        parse_event(json.dumps(both))


def test_a_newer_version_is_refused_whatever_its_shape_and_unknown_fields_are_named() -> None:
    beat = NodeHeartbeat(source="a", node="n-1", data=HeartbeatData(seq=1, pid=1, interval_s=1))
    doc = json.loads(beat.model_dump_json())
    for body in ({**doc, "version": 2}, {**doc, "version": 7, "data": {"other": "shape"}}):
        with pytest.raises(UnsupportedVersion,
                           match=r"node.heartbeat version \d not supported \(max 1\)"):
            read_event(json.dumps(body))
    doc["data"]["battery"] = 0.5
    doc["region"] = "eu"
    event, unknown = read_event(json.dumps(doc))
    assert event == beat and unknown == ("data.battery", "region")
    with pytest.raises(ValidationError, match="Extra inputs"):  # producers stay strict
        parse_event(json.dumps(doc))


def test_a_version_1_fault_is_read_as_version_2() -> None:
    """fault.opened version 2 calls the flag ``quarantine`` (version 1:
    ``cordon``); a stored version 1 event keeps its meaning."""
    from libs.events import FaultOpened, FaultOpenedData

    v2 = FaultOpened(source="failover", node="n1", data=FaultOpenedData(
        fault_id="f1", kind="alert:gpu_temp_high", reason="hot", quarantine=False))
    doc = json.loads(encode_event(v2))
    assert doc["version"] == 2 and doc["data"]["quarantine"] is False
    doc["version"] = 1
    doc["data"]["cordon"] = doc["data"].pop("quarantine")
    event, unknown = read_event(json.dumps(doc))
    assert isinstance(event, FaultOpened) and unknown == ()
    assert event.version == 2 and event.data.quarantine is False
    doc["data"]["cordon"] = True
    assert read_event(json.dumps(doc))[0].data.quarantine is True  # type: ignore[attr-defined]
