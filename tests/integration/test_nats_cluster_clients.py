"""Clients on a real 3-server NATS cluster (the ``nats_cluster`` fixture)
when the server they are on dies: the bus, the lean pull connection and
failover's heartbeat listener each go on through another member by
themselves, even when they were given one server's URL only (the others are
the ones the cluster announced), and the login that rode in that URL still
signs them in there. The topology declared, a durable consumer started or a
KV bucket asked for while the cluster has lost its quorum is there once the
quorum is back."""

from __future__ import annotations

import asyncio

import nats.js.errors

from libs import natsfast
from libs.beats import BeatListener
from libs.bus import CONTROL, Bus
from libs.embedded import NatsCluster, NatsServer
from libs.events import AgentStoppingData, Event, HeartbeatData, NodeAgentStopping, NodeHeartbeat
from libs.topology import BUCKETS, STREAMS
from tests.helpers import until


def on(cluster: NatsCluster, bus: Bus) -> NatsServer:
    url = bus.nc.connected_url
    assert url is not None
    return next(s for s in cluster.servers if s.port == url.port)


def beat(node: str) -> NodeHeartbeat:
    return NodeHeartbeat(source="test", node=node, data=HeartbeatData(seq=1, pid=1,
                                                                      interval_s=1.0))


async def test_a_login_in_one_servers_url_signs_in_on_the_others(
        nats_cluster: NatsCluster) -> None:
    """One member's URL with the platform login: when it dies the bus goes
    to a member the cluster announced, signed in, and publishes durably."""
    first = nats_cluster.servers[0]
    bus = await Bus.connect(first.url, "test")
    try:
        await bus.ensure_topology(3)
        assert on(nats_cluster, bus) is first
        before = (await bus.js.publish("safe.job.j1.placed", b"{}")).seq
        first.kill()

        async def published() -> int:
            return (await bus.js.publish("safe.job.j1.placed", b"{}", timeout=2)).seq

        seq = await until(published, "a publish through another member")
        assert seq == before + 1
        assert bus.link.state == "connected" and on(nats_cluster, bus) is not first
        assert bus.link.disconnects == 1
    finally:
        await bus.close()


async def test_lean_connections_take_the_members_that_are_up(
        nats_cluster: NatsCluster) -> None:
    """``natsfast.connect`` tries every server of the list; the bus hands
    lean connections every member it knows, the announced ones included."""
    bus = await Bus.connect(nats_cluster.servers[1].url, "test")
    try:
        await until(lambda: asyncio.sleep(0, len(bus.nc.servers) == 3),
                         "the cluster to announce its members")
        assert bus.url is not None and len(bus.url.split(",")) == 3
        assert all("platform:cluster-test@" in u for u in bus.url.split(","))
        nats_cluster.servers[1].kill()
        for _ in range(6):  # each try starts from a random member
            _, writer = await natsfast.connect(bus.url, None, "test")
            assert writer.get_extra_info("peername")[1] != nats_cluster.servers[1].port
            writer.close()
    finally:
        await bus.close()


async def test_heartbeats_are_heard_again_after_the_listeners_server_dies(
        nats_cluster: NatsCluster) -> None:
    """failover's heartbeat listener: the member its connection is on dies,
    the listener reconnects to another by itself and hears the beats again."""
    listener_bus = await Bus.connect(nats_cluster.servers[0].url, "failover")
    sender = await Bus.connect(nats_cluster.url, "bench-agent")
    heard: list[str] = []
    listener = BeatListener(listener_bus, lambda nodes, _at: heard.extend(nodes))
    try:
        await until(lambda: asyncio.sleep(0, len(listener_bus.nc.servers) == 3),
                         "the cluster to announce its members")
        await listener.start()
        assert listener.lean

        async def heard_one(node: str) -> bool:
            await sender.publish(beat(node))
            await asyncio.sleep(0.1)
            return node in heard

        await until(lambda: heard_one("n1"), "a beat before the kill")
        # The listener's own connection picks a member at random: kill that one.
        [holding] = [s for s in nats_cluster.servers if "beats" in s.client_names()]
        holding.kill()
        await until(lambda: heard_one("n2"), "a beat after the listener's server died")
        assert listener.connects == 2 and listener.connected
    finally:
        await listener.stop()
        await sender.close()
        await listener_bus.close()


async def test_a_consumer_started_without_a_quorum_is_made_when_the_quorum_is_back(
        nats_cluster: NatsCluster) -> None:
    """Two of three members are down when a service starts its consumer: the
    request to make the durable times out (no JetStream leader answers).
    The consumer asks again until the members are back, then delivers,
    instead of ending with the timeout and leaving its service deaf."""
    first, *others = nats_cluster.servers
    bus = await Bus.connect(first.url, "test")
    seen: list[str] = []

    async def handler(event: Event) -> None:
        seen.append(event.id)

    group = bus.group()
    try:
        await bus.ensure_topology(3)
        for server in others:
            server.kill()
        group.consume(durable="patient", subjects=["safe.node.n1.agent_stopping"],
                      stream=CONTROL, handler=handler)
        await asyncio.sleep(6.0)  # past the 5 s the first request waits for its answer
        for server in others:
            await asyncio.to_thread(server.start)
        event = NodeAgentStopping(source="test", node="n1",
                                  data=AgentStoppingData(back_within_s=1, reason="test"))

        async def published() -> bool:
            await bus.publish(event)  # stored, or stored by an earlier try
            return True

        await until(published, "a publish with the quorum back", 60)
        await until(lambda: asyncio.sleep(0, seen == [event.id]),
                    "the event through the consumer made late", 60)
    finally:
        await bus.stop_group(group)
        await bus.close()


async def test_a_bucket_asked_for_without_a_quorum_is_handed_over_when_the_quorum_is_back(
        nats_cluster: NatsCluster) -> None:
    """What a service asks for first at start, its buckets: with two of
    three members down, the bucket's leader among them, the request times
    out, and while they come back JetStream answers 503. ``Bus.kv`` asks
    again until the bucket answers, instead of ending the service's start
    with the first error."""
    bus = await Bus.connect(nats_cluster.url, "test")
    try:
        await bus.ensure_topology(3)
        leader = (await bus.js.stream_info("KV_jobs")).cluster.leader  # type: ignore[union-attr]
        others = [s for s in nats_cluster.servers if s.name != leader][1:]
        others.append(nats_cluster.member(str(leader)))
        for server in others:  # a follower survives alone
            server.kill()

        async def unanswered() -> bool:
            try:
                await asyncio.wait_for(bus.js.stream_info("KV_jobs"), 1)
            except (TimeoutError, nats.js.errors.ServiceUnavailableError):
                return True
            return False

        await until(unanswered, "the bucket's stream to stop answering", 30)
        asked = asyncio.create_task(bus.kv("jobs"))
        await asyncio.sleep(3.0)
        assert not asked.done()
        for server in others:
            await asyncio.to_thread(server.start)
        jobs = await asyncio.wait_for(asked, 60)
        # The members still settle after they answer (a 503 "JetStream
        # system temporarily unavailable" can come between two requests):
        # the write and the read are each asked again until they answer.
        await until(lambda: jobs.put("j1", b"{}"), "a write to the bucket", 30)
        entry = await until(lambda: jobs.get("j1"), "a read of the bucket", 30)
        assert entry.value == b"{}"
    finally:
        await bus.close()


async def test_the_topology_declared_without_a_quorum_is_made_when_the_quorum_is_back(
        nats_cluster: NatsCluster) -> None:
    """The first thing every service does at start, on a cluster whose
    other two members are still down (a rolling restart of the NATS pods):
    each declaration times out (no JetStream leader answers).
    ``ensure_topology`` asks again until the members are back, then every
    stream and bucket exists with its three replicas, instead of ending the
    service's start with the first refusal."""
    first, *others = nats_cluster.servers
    for server in others:
        server.kill()
    bus = await Bus.connect(first.url, "test")
    declared = asyncio.create_task(bus.ensure_topology(3))
    try:
        await asyncio.sleep(3.0)
        assert not declared.done(), declared.exception()  # the message: only once done
        for server in others:
            await asyncio.to_thread(server.start)
        await asyncio.wait_for(declared, 60)
        for stream in [*(s.name for s in STREAMS), *(f"KV_{b.name}" for b in BUCKETS)]:
            info = await bus.js.stream_info(stream)
            assert info.config.num_replicas == 3, stream
    finally:
        declared.cancel()  # still asking only when an assertion failed
        await bus.close()
