"""Bus helpers against a real nats-server with JetStream."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from libs.bus import (
    CONTROL,
    DEADLETTER,
    ORIGIN_HEADER,
    REASON_HEADER,
    Bus,
    MessageTooLarge,
    UndeclaredRoute,
    dlq_subject,
)
from libs.events import (
    AgentStoppingData,
    Event,
    HeartbeatData,
    LogRecord,
    LogRecordData,
    NodeAgentStopping,
    NodeHeartbeat,
)
from libs.metrics import ServiceMetrics
from libs.routes import Empty, Endpoint, Reply, Routes


def note(node: str = "n1", seq: int = 1, **kw: object) -> NodeAgentStopping:
    """A small CONTROL event, numbered by ``back_within_s``."""
    return NodeAgentStopping(source="test", node=node,
                             data=AgentStoppingData(back_within_s=seq, reason="test"), **kw)


async def stream_count(bus: Bus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).state.messages


async def wait_until(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_topology_is_idempotent(bus: Bus) -> None:
    await bus.ensure_topology()
    await bus.ensure_topology()
    names = {s.config.name async for s in _streams(bus)}
    assert {"CONTROL", "TELEMETRY", "DEADLETTER"} <= names
    for bucket in ("nodes", "jobs", "faults"):
        await bus.kv(bucket)


async def _streams(bus: Bus):  # type: ignore[no-untyped-def]
    for info in await bus.js.streams_info():
        yield info


async def test_publish_deduplicates_on_event_id(bus: Bus) -> None:
    event = note()
    assert await bus.publish(event) is True
    assert await bus.publish(event) is False
    assert await stream_count(bus, "CONTROL") == 1


async def test_publish_at_gives_the_stream_sequence_and_stored_after_reads_on_from_it(
        bus: Bus) -> None:
    """What a live subscription missed is read back from the stream: the
    events of one class and keys stored after a sequence, oldest first."""
    first = await bus.publish_at(note("n1", 1))
    await bus.publish(note("n2", 2))  # another node's
    await bus.publish(NodeAgentStopping(source="test", node="n1", id="bad",
                                        data=AgentStoppingData(back_within_s=9, reason="x")))
    await bus.nc.publish("safe.node.n1.agent_stopping", b"not an event")  # no stream ack needed
    third = note("n1", 3)
    third_seq = await bus.publish_at(third)
    assert await bus.publish_at(third) == third_seq  # a repeat: the first copy's sequence
    await bus.flush()
    found = await bus.stored_after(NodeAgentStopping, first, node="n1")
    assert [(e.node, e.data.back_within_s) for _, e in found] == [("n1", 9), ("n1", 3)]
    assert found[-1] == (third_seq, third) and found[0][0] > first
    assert await bus.stored_after(NodeAgentStopping, third_seq, node="n1") == []
    assert [e.data.back_within_s for _, e in
            await bus.stored_after(NodeAgentStopping, 0, node="n1")] == [1, 9, 3]
    with pytest.raises(ValueError, match="core NATS"):
        await bus.publish_at(NodeHeartbeat(source="test", node="n1",
                                           data=HeartbeatData(seq=1, pid=1, interval_s=1.0)))


async def test_a_heartbeat_goes_out_on_core_nats_and_no_stream_keeps_it(bus: Bus) -> None:
    """Liveness is not history: a beat reaches who listens now, and nothing
    stores it (12,500 nodes beat once a second)."""
    heard: list[NodeHeartbeat] = []

    async def on_beat(event: NodeHeartbeat) -> None:
        heard.append(event)

    await bus.listen(NodeHeartbeat, on_beat)
    sent = NodeHeartbeat(source="test", node="n1",
                         data=HeartbeatData(seq=7, pid=1, interval_s=1.0))
    assert sent.subject == "safe.live.n1.heartbeat"
    assert await bus.publish(sent) is True

    async def done() -> bool:
        return [e.id for e in heard] == [sent.id]

    await wait_until(done)
    for info in await bus.js.streams_info():
        assert info.state.messages == 0, f"{info.config.name} kept a heartbeat"


async def test_durable_consumer_handles_in_order_and_acks(bus: Bus) -> None:
    seen: list[int] = []

    async def handler(event: Event) -> None:
        assert isinstance(event, NodeAgentStopping)
        seen.append(int(event.data.back_within_s))

    for i in range(1, 51):
        await bus.publish(note(seq=i))
    bus.consume(durable="t1", subjects=["safe.node.*.agent_stopping"], stream=CONTROL,
                handler=handler, batch=16)

    async def done() -> bool:
        return len(seen) == 50

    await wait_until(done)
    assert seen == list(range(1, 51))
    await asyncio.sleep(0.2)
    info = await bus.js.consumer_info("CONTROL", "t1")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_batches_come_with_stream_sequence(bus: Bus) -> None:
    got: list[tuple[str, int]] = []

    async def on_batch(batch: list[tuple[Event, int]]) -> None:
        got.extend((e.id, seq) for e, seq in batch)

    ids = [(await bus.publish(e), e.id)[1] for e in (note(seq=i) for i in range(1, 11))]
    bus.consume(durable="t2", subjects=list(CONTROL.subjects), stream=CONTROL,
                batch_handler=on_batch, batch=100)

    async def done() -> bool:
        return len(got) == 10

    await wait_until(done)
    assert [i for i, _ in got] == ids and [s for _, s in got] == list(range(1, 11))


async def test_malformed_message_is_dead_lettered_and_consumer_keeps_serving(bus: Bus) -> None:
    seen: list[str] = []

    async def handler(event: Event) -> None:
        seen.append(event.id)

    subject = "safe.node.n1.agent_stopping"
    await bus.js.publish(subject, b'{"type": "node.agent_stopping", "oops": 1}')
    await bus.js.publish(subject, b"\xff not json")
    good = note()
    await bus.publish(good)
    bus.consume(durable="t3", subjects=["safe.node.*.agent_stopping"], stream=CONTROL,
                handler=handler)

    async def done() -> bool:
        return seen == [good.id] and bus.stats.dead_lettered == 2

    await wait_until(done)
    sub = await bus.js.pull_subscribe(dlq_subject("test"), stream=DEADLETTER.name)
    msgs = await sub.fetch(2, timeout=2)
    assert {m.headers[ORIGIN_HEADER] for m in msgs} == {"safe.node.n1.agent_stopping"}
    reasons = [m.headers[REASON_HEADER] for m in msgs]
    assert all(r.startswith("invalid event:") for r in reasons)
    assert any("Field required" in r for r in reasons)


async def test_a_bucket_made_a_moment_later_is_found_one_never_made_is_not(bus: Bus) -> None:
    """On a cluster a just-created bucket can be unknown to the member that
    answers for a moment: Bus.kv asks again for a while before giving up."""
    from nats.js import api
    from nats.js.errors import BucketNotFoundError

    async def make_later() -> None:
        await asyncio.sleep(0.5)
        await bus.js.create_key_value(api.KeyValueConfig(bucket="later"))

    maker = asyncio.create_task(make_later())
    kv = await bus.kv("later", appear_s=5)
    await maker
    assert kv is not None
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(BucketNotFoundError):
        await bus.kv("never", appear_s=0.3)
    assert asyncio.get_running_loop().time() - t0 < 2
    with pytest.raises(BucketNotFoundError):
        await bus.kv("never", appear_s=0)


async def test_handled_and_refused_messages_are_counted_by_subject(bus: Bus) -> None:
    """/metrics figures: handled and dead-lettered by subject pattern, the
    handler's time, how late messages were handled, the durable's pending."""
    bus.metrics = ServiceMetrics("test")
    subject = "safe.node.n7.agent_stopping"
    await bus.js.publish(subject, b"\xff not json")
    for i in range(1, 6):
        await bus.publish(note(node="n7", seq=i))
    seen: list[str] = []

    async def handler(event: Event) -> None:
        seen.append(event.id)

    bus.consume(durable="t-metrics", subjects=["safe.node.*.agent_stopping"], stream=CONTROL,
                handler=handler)

    async def done() -> bool:
        return len(seen) == 5 and bus.stats.dead_lettered == 1

    await wait_until(done)
    await bus.measure_pending()
    page = {f.name: f for f in text_string_to_metric_families(bus.metrics.render().decode())}

    def value(name: str, suffix: str = "", **labels: str) -> float:
        return sum(s.value for s in page[name].samples
                   if s.name == name + suffix and labels.items() <= s.labels.items())

    pattern = "safe.node.*.agent_stopping"
    assert value("primus_messages_handled", "_total", consumer="t-metrics",
                 subject=pattern) == 5
    assert value("primus_messages_dead_lettered", "_total", subject=pattern) == 1
    assert value("primus_handler_seconds", "_count", consumer="t-metrics") == 5
    assert value("primus_consumer_lag_seconds", "_count", consumer="t-metrics") == 5
    assert ("t-metrics" in {s.labels.get("consumer") for s in page["primus_consumer_pending"]
                            .samples})
    assert value("primus_consumer_pending", consumer="t-metrics") == 0


async def test_failing_handler_is_retried_then_dead_lettered(bus: Bus) -> None:
    calls: list[int] = []

    async def handler(event: Event) -> None:
        calls.append(1)
        raise RuntimeError("disk full")

    await bus.publish(note())
    bus.consume(durable="t4", subjects=["safe.node.*.agent_stopping"], stream=CONTROL,
                handler=handler, max_deliver=3)

    async def done() -> bool:
        return bus.stats.dead_lettered == 1

    await wait_until(done, timeout=20)
    assert len(calls) == 3
    assert "handler failed 3 times" in bus.stats.dead_letter_reasons[-1]
    assert "disk full" in bus.stats.dead_letter_reasons[-1]


class Said(BaseModel):
    x: int


class Echo(Reply):
    you_said: int


ECHO = Endpoint("safe.query.echo", Said, Echo, "echo")


async def test_request_reply_and_bad_request(bus: Bus) -> None:
    """A typed endpoint: the request is validated into its model at the edge,
    the return value is the reply, and a refused or failing request is
    answered with the reason, never with silence."""
    async def echo(req: Said) -> Echo:
        if req.x < 0:
            raise ValueError("negative numbers are not echoed")
        return Echo(you_said=req.x)

    served = await bus.serve(ECHO, echo)
    assert await bus.request(ECHO.subject, {"x": 3}) == {"ok": True, "error": None,
                                                         "you_said": 3}
    assert (await bus.ask(ECHO, Said(x=4))).you_said == 4
    reply = await bus.request(ECHO.subject, {})
    assert reply == {"ok": False, "error": "invalid request: x: Field required"}
    reply = await bus.request(ECHO.subject, {"x": "three"})
    assert reply["ok"] is False and reply["error"].startswith("invalid request: x: ")
    reply = await bus.request(ECHO.subject, {"x": -1})
    assert reply == {"ok": False, "error": "negative numbers are not echoed"}
    await served.stop()
    with pytest.raises(nats.errors.NoRespondersError):
        await bus.request(ECHO.subject, {"x": 1}, timeout_s=1)


async def test_a_bus_with_a_route_table_refuses_what_the_table_does_not_name(
        bus: Bus) -> None:
    bus.routes = Routes("tester", "a test", publishes=(LogRecord,), calls=(ECHO,),
                        service_shell=False)
    with pytest.raises(UndeclaredRoute, match="publishes node.agent_stopping"):
        await bus.publish(note())
    with pytest.raises(UndeclaredRoute, match="serves safe.query.echo"):
        await bus.serve(ECHO, lambda _: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(UndeclaredRoute, match="calls safe.query.other"):
        await bus.request("safe.query.other")
    with pytest.raises(UndeclaredRoute, match="listens to NodeHeartbeat"):
        await bus.listen(NodeHeartbeat, lambda _: None)  # type: ignore[arg-type,return-value]
    await bus.publish(LogRecord(source="test", data=LogRecordData(level="info", message="ok")))


async def test_nothing_the_bus_sends_can_exceed_the_servers_limit(bus: Bus) -> None:
    """An oversized message makes the server close the connection for good:
    the bus refuses to send one, and answers a request whose reply would be
    too large with an error instead of silence."""
    line = LogRecord(source="test", data=LogRecordData(level="info",
                                                       message="x" * bus.max_payload))
    with pytest.raises(MessageTooLarge, match="takes at most"):
        await bus.publish(line)

    async def huge(_: Empty) -> Reply:
        return Reply(rows=["y" * bus.max_payload])

    await bus.serve(Endpoint("safe.query.huge", Empty, Reply, "too much"), huge)
    reply = await bus.request("safe.query.huge")
    assert reply["ok"] is False and "over the bus's limit" in reply["error"]
    assert bus.nc.is_connected and await bus.publish(note())  # still connected and serving


async def test_close_drains_pending_publishes(nats_url: str) -> None:
    writer = await Bus.connect(nats_url, "w")
    await writer.ensure_topology()
    for i in range(100):
        event = note(seq=i)
        await writer.nc.publish(event.subject, event.model_dump_json().encode())
    await writer.close()
    reader = await Bus.connect(nats_url, "r")
    try:
        assert await stream_count(reader, "CONTROL") == 100
    finally:
        await reader.close()


async def test_unreachable_server_gives_a_clear_error() -> None:
    with pytest.raises(ConnectionError, match="cannot reach NATS at nats://127.0.0.1:1"):
        await Bus.connect("nats://127.0.0.1:1", "x", timeout_s=1.0)
