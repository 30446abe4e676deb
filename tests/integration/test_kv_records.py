"""The state buckets read and written through their record models
(``libs.kv``, ``libs.records``) on a real nats-server: writes are
revision-checked, readers skip what they cannot read and say why, and
records are versioned like events."""

from __future__ import annotations

import json

import pytest

from libs.bus import Bus
from libs.inventory import HostSpec
from libs.kv import RecordConflict
from libs.records import BENCH, JOBS, NODES, NodeRecord, UnsupportedRecord
from tests.helpers import job_record


def node(name: str, state: str = "ready") -> NodeRecord:
    spec = HostSpec(name=name, ip="10.0.0.1", gpu_model="MI300X", gpu_count=8)
    return NodeRecord(spec=spec, state=state, registration=f"reg-{name}")  # type: ignore[arg-type]


async def test_a_write_over_someone_elses_is_refused_unless_the_writer_decides(
        bus: Bus) -> None:
    mine, theirs = await bus.records(NODES), await bus.records(NODES)
    await mine.put("n1", node("n1"))
    assert (await theirs.get("n1")) == node("n1")
    await theirs.put("n1", node("n1", "quarantined"))  # at the revision it read: fine
    with pytest.raises(RecordConflict) as caught:
        await mine.put("n1", node("n1", "draining"))  # mine never saw theirs
    assert caught.value.current == node("n1", "quarantined")
    assert (await theirs.get("n1")).state == "quarantined"  # nothing was lost

    # The conflict showed mine the stored record: writing again is mine to decide.
    await mine.put("n1", node("n1", "draining"))
    await theirs.put("n1", node("n1", "repair"), on_conflict=lambda _: None)
    seen: list[NodeRecord | None] = []
    await mine.put("n1", node("n1", "ready"), on_conflict=seen.append)
    assert seen == [node("n1", "repair")]
    assert (await theirs.get("n1")).state == "ready"
    # A key someone else created first is a conflict too, not an overwrite.
    await theirs.put("n2", node("n2"))
    with pytest.raises(RecordConflict):
        await mine.put("n2", node("n2", "repair"))


async def test_readers_skip_what_they_cannot_read_and_say_why(bus: Bus) -> None:
    kv = await bus.kv("jobs")
    await kv.put("good", job_record("good", "running", "n1"))
    await kv.put("garbage", b"{not json")
    await kv.put("future", json.dumps({**json.loads(job_record("future", "pending")),
                                       "version": 9, "shiny": 1}).encode())
    await kv.put("extra", json.dumps({**json.loads(job_record("extra", "pending")),
                                      "added_later": [1, 2]}).encode())
    jobs = await bus.records(JOBS)
    found = await jobs.load()
    assert sorted(found) == ["extra", "good"]  # a field a newer owner added is read without it
    assert "not a JobRecord" in jobs.unreadable["garbage"]
    assert "JobRecord version 9 not supported (max 1)" in jobs.unreadable["future"]
    with pytest.raises(UnsupportedRecord):
        await jobs.get("future")


async def test_an_old_bench_record_is_read_as_the_current_version(bus: Bus) -> None:
    run = {"level": "standard", "passed": True, "device": "cpu", "device_count": 1,
           "duration_s": 1.0, "time": 5.0, "event_id": "e1", "figures": [
               {"name": "gemm_fp32_tflops", "value": 0.2, "unit": "TFLOPS"}]}
    await (await bus.kv("bench")).put("n1", json.dumps(run).encode())  # version 1: one run
    record = (await (await bus.records(BENCH)).load())["n1"]
    assert record.version == 2 and list(record.levels) == ["standard"]
    assert record.levels["standard"].figures[0].value == 0.2 and record.verdict is None


async def test_reading_a_bucket_opens_no_consumer_and_skips_deleted_keys(bus: Bus) -> None:
    """A bucket is read from its stream's subject list: no consumer per read
    (a stream takes 1,000 and each lingered for minutes), deleted keys are
    listed but not loaded, an empty bucket is an empty dict."""
    nodes = await bus.records(NODES)
    assert await nodes.keys() == [] and await nodes.load() == {}
    for name in ("n3", "n1", "n2"):
        await nodes.put(name, node(name))
    await nodes.delete("n2")
    for _ in range(1100):  # more reads than a stream takes consumers
        loaded = await nodes.load()
    assert sorted(loaded) == ["n1", "n3"] and await nodes.keys() == ["n1", "n2", "n3"]
    info = await bus.js.stream_info("KV_nodes")
    assert info.state.consumer_count == 0
