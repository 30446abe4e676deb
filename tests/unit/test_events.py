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
    HeartbeatData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    NodeHeartbeat,
    encode_event,
    event_type_name,
    parse_event,
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
    assert hb.subject == "safe.node.gpu-07.heartbeat"
    assert job.subject == "safe.job.j-42.submitted"


@pytest.mark.parametrize("bad", ["a.b", "a b", "*", ">", "", "-x"])
def test_keys_that_would_break_subjects_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="not a valid name"):
        NodeHeartbeat(source="a", node=bad, data=HeartbeatData(seq=1, pid=1, interval_s=1))


def test_unknown_type_and_missing_fields_fail_validation() -> None:
    with pytest.raises(ValidationError):
        parse_event(json.dumps({"type": "node.exploded", "source": "x", "data": {}}))
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
