"""The hot-path consumer (``Bus.consume_raw``) against a real nats-server,
over both links of the one puller (``libs.pull``): its own lean connection
(``libs.natsfast``) and the service's nats-py connection. Batches fill,
everything is acked once, refused messages are dead-lettered with the
reason, failures are retried, and a dropped connection loses nothing."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.msg import Msg

from libs import pull
from libs.bus import DEADLETTER, REASON_HEADER, TELEMETRY, Bus, dlq_subject
from libs.natsfast import LeanLink


async def publish(bus: Bus, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await bus.js.publish(f"safe.telemetry.node.n{i % 7}", f'{{"i": {i}}}'.encode(),
                             headers={"Nats-Msg-Id": f"m{i}"})


async def until(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("own_connection", [True, False], ids=["natsfast", "nats-py"])
async def test_batches_fill_and_everything_is_acked_once(bus: Bus, own_connection: bool) -> None:
    seen: list[str] = []
    sizes: list[int] = []

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        sizes.append(len(msgs))
        seen.extend(m.headers["Nats-Msg-Id"] for m in msgs)
        assert all(m.subject.startswith("safe.telemetry.node.n") for m in msgs)
        return []

    await publish(bus, 1000)
    bus.consume_raw(durable="hot", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=300, fill_s=0.2, own_connection=own_connection)
    await until(lambda: len(seen) == 1000)
    await publish(bus, 10, start=1000)  # a trickle after the backlog: comes within fill_s
    await until(lambda: len(seen) == 1010)
    assert sorted(seen) == sorted(f"m{i}" for i in range(1010))
    assert max(sizes) == 300
    await asyncio.sleep(0.3)
    info = await bus.js.consumer_info("TELEMETRY", "hot")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert bus.stats.handled == 1010


async def test_a_batch_bigger_than_one_pull_request_fills_within_its_wait(
        bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull request brings at most MAX_BYTES; the batch is made of as many
    requests as it takes (large inserts are what keep ClickHouse's merges cheap)."""
    monkeypatch.setattr(pull, "MAX_BYTES", 64 << 10)
    sizes: list[int] = []

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        sizes.append(len(msgs))
        return []

    body = b"x" * (10 << 10)
    for i in range(60):
        await bus.js.publish(f"safe.telemetry.node.n{i}", body, headers={"Nats-Msg-Id": f"b{i}"})
    bus.consume_raw(durable="big", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=60, fill_s=5.0)
    await until(lambda: sum(sizes) == 60)
    assert sizes == [60]  # ~6 messages per request, one batch


@pytest.mark.parametrize("own_connection", [True, False], ids=["natsfast", "nats-py"])
async def test_what_arrives_while_a_batch_is_stored_becomes_the_next_batch(
        bus: Bus, own_connection: bool) -> None:
    """A batch handed over while the previous one is still being stored would
    only queue behind it: the puller keeps filling it instead, so the wait
    is never spent twice and the batches grow with the store's pace."""
    sizes: list[int] = []

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        sizes.append(len(msgs))
        if len(sizes) == 1:
            await asyncio.sleep(1.5)  # a slow insert
        return []

    await publish(bus, 10)
    bus.consume_raw(durable="paced", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=1000, fill_s=0.05, own_connection=own_connection)
    await until(lambda: len(sizes) == 1)
    await publish(bus, 50, start=10)  # arrives in two waves while the first batch is stored
    await asyncio.sleep(0.5)
    await publish(bus, 50, start=60)
    await until(lambda: sum(sizes) == 110)
    assert sizes == [10, 100]


async def test_refused_messages_are_dead_lettered_with_the_reason(bus: Bus) -> None:
    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        return [(m, "invalid event: odd") for m in msgs if m.data.endswith(b"3}")]

    await publish(bus, 20)
    bus.consume_raw(durable="hot2", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=50, fill_s=0.1)
    await until(lambda: bus.stats.handled == 18 and bus.stats.dead_lettered == 2)
    sub = await bus.js.pull_subscribe(dlq_subject("test"), stream=DEADLETTER.name)
    dead = await sub.fetch(2, timeout=5)
    assert {m.headers[REASON_HEADER] for m in dead} == {"invalid event: odd"}
    assert sorted(m.data for m in dead) == [b'{"i": 13}', b'{"i": 3}']


async def test_a_failing_store_is_retried_then_dead_lettered(bus: Bus) -> None:
    calls: list[int] = []

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        calls.append(len(msgs))
        raise RuntimeError("store away")

    await publish(bus, 3)
    bus.consume_raw(durable="hot3", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=10, fill_s=0.1, max_deliver=2)
    await until(lambda: bus.stats.dead_lettered == 3, timeout=30)
    assert sum(calls) == 6  # each message tried twice
    assert "handler failed 2 times" in bus.stats.dead_letter_reasons[-1]


async def test_a_dropped_connection_loses_nothing(bus: Bus) -> None:
    seen: list[str] = []
    first = asyncio.Event()

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        seen.extend(m.headers["Nats-Msg-Id"] for m in msgs)
        first.set()
        return []

    bus.consume_raw(durable="hot4", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=20, fill_s=0.1, ack_wait_s=2)
    await publish(bus, 20)
    await asyncio.wait_for(first.wait(), 10)
    [link] = [p.link for p in bus.consumers._pullers if isinstance(p.link, LeanLink)]
    assert link._writer is not None
    link._writer.transport.abort()  # the socket dies under it
    await publish(bus, 50, start=20)
    await until(lambda: len(set(seen)) == 70, timeout=30)
    assert set(seen) == {f"m{i}" for i in range(70)}


@pytest.mark.parametrize("own_connection", [True, False], ids=["natsfast", "nats-py"])
async def test_a_batch_slower_than_the_ack_wait_is_kept_alive_not_redelivered(
        bus: Bus, own_connection: bool) -> None:
    """A short ack wait (so a dead replica's batch moves on quickly) must not
    deliver a slow batch twice: the consumer says +WPI for a batch still in
    hand after a third of the wait, and for the batch filling behind it."""
    seen: list[str] = []
    batches = 0

    async def handler(msgs: list[Msg]) -> list[tuple[Msg, str]]:
        nonlocal batches
        batches += 1
        seen.extend(m.headers["Nats-Msg-Id"] for m in msgs)
        if batches <= 2:
            await asyncio.sleep(3.5)  # an insert that takes over twice the ack wait
        return []

    await publish(bus, 400)
    bus.consume_raw(durable="slow", subjects=list(TELEMETRY.subjects), stream=TELEMETRY,
                    handler=handler, batch=100, fill_s=0.1, inflight=2, ack_wait_s=1.5,
                    own_connection=own_connection)
    await until(lambda: len(seen) >= 400, timeout=30)
    await asyncio.sleep(2.0)  # a redelivery would have come by now
    assert sorted(seen) == sorted(f"m{i}" for i in range(400))  # each once
    info = await bus.js.consumer_info("TELEMETRY", "slow")
    assert info.num_redelivered == 0 and info.num_ack_pending == 0
