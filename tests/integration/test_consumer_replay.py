"""A durable with ``replay_s`` (libs/routes.Consumer): made new, it starts
that far back in the stream rather than at its beginning; made before, it
goes on from where it was; one that cannot be made yet is asked for again.
Real nats-server."""

from __future__ import annotations

import asyncio

from libs.bus import CONTROL, Bus
from libs.events import AgentStoppingData, Event, NodeAgentStopping
from tests.helpers import until


def beat(seq: int) -> NodeAgentStopping:
    """A small CONTROL event, numbered by ``back_within_s``."""
    return NodeAgentStopping(source="test", node="n1",
                             data=AgentStoppingData(back_within_s=seq, reason="test"))


async def test_a_new_durable_starts_replay_s_back_and_an_old_one_goes_on(bus: Bus) -> None:
    seen: list[int] = []

    async def handler(event: Event) -> None:
        assert isinstance(event, NodeAgentStopping)
        seen.append(int(event.data.back_within_s))

    def consume() -> object:
        group = bus.group()
        group.consume(durable="replayed", subjects=["safe.node.n1.agent_stopping"], stream=CONTROL,
                      handler=handler, replay_s=0.5)
        return group

    await bus.publish(beat(1))
    await asyncio.sleep(1.5)  # older than replay_s when the durable is made
    await bus.publish(beat(2))
    group = consume()
    await bus.publish(beat(3))
    await until(lambda: asyncio.sleep(0, len(seen) >= 2), "the recent events")
    await bus.stop_group(group)  # type: ignore[arg-type]
    assert seen == [2, 3]

    await bus.publish(beat(4))
    await asyncio.sleep(1.5)  # older than replay_s, yet after where the durable was
    group = consume()
    await until(lambda: asyncio.sleep(0, len(seen) >= 3), "the event sent while away")
    await bus.stop_group(group)  # type: ignore[arg-type]
    assert seen == [2, 3, 4]
    info = await bus.js.consumer_info(CONTROL.name, "replayed")
    assert info.config.deliver_policy == "by_start_time"  # made once, not made again


async def test_a_consumer_started_before_its_stream_is_made_once_the_stream_is_there(
        bus: Bus) -> None:
    """The stream is gone when the consumer starts (an operator deleted it, or
    the service that declares it is not up yet): the server refuses the
    durable, and the consumer asks again until it can make it, rather than
    fetching from nothing for ever."""
    seen: list[int] = []

    async def handler(event: Event) -> None:
        assert isinstance(event, NodeAgentStopping)
        seen.append(int(event.data.back_within_s))

    await bus.js.delete_stream(CONTROL.name)
    group = bus.group()
    group.consume(durable="late", subjects=["safe.node.n1.agent_stopping"], stream=CONTROL,
                  handler=handler)
    try:
        await asyncio.sleep(1.0)  # refused at least once
        await bus.ensure_topology()
        await bus.publish(beat(7))
        await until(lambda: asyncio.sleep(0, seen == [7]), "the event on the late stream")
    finally:
        await bus.stop_group(group)
