"""Bus latency and throughput through the project's bus helpers.

Starts a real nats-server (JetStream, file storage) on a free port and sends
~1 KiB events (a node's telemetry with its GPUs) through ``Bus.publish`` to a
durable pull consumer:

- single: publish one event, wait until the handler has it, repeat
  (latency with nothing else in flight);
- stream, one-by-one handler: a burst of events, consumed one at a time;
- stream, batch handler: the same burst, publishes pipelined, consumed in
  batches (how lens-collector consumes).

Baseline, measured in the same run: plain core-NATS publish → subscribe of
the same payload (no persistence, no acks), i.e. the cost floor of the
network path.

Also in the same run, why ordered consumers stay on the bus's own puller
(``libs.consume``) rather than faststream's JetStream pull subscriber:
faststream keeps stream order only when each fetch brings one message
(single latency and burst rate measured so), and with larger fetches it
runs a batch's handlers at once, so a handler that awaits I/O sees events
out of their stream order (the share is measured, beside the bus's own
consumer with the same handler). And request/reply through the bus's typed
endpoints (faststream subscribers) against a plain nats-py responder.
Ends with one JSON line.

    python bench/bus_latency.py [--count 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.bus import CONTROL, TELEMETRY, Bus  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.events import (  # noqa: E402
    Event,
    GpuMetrics,
    JobCheckpoint,
    JobCheckpointData,
    NodeTelemetry,
    NodeTelemetryData,
    encode_event,
)
from libs.routes import Empty, Endpoint, Reply  # noqa: E402

IO_S = 0.002  # a handler that awaits up to this long (a KV write, a store)


def sample_event(seq: int, node: str | None = None) -> NodeTelemetry:
    gpus = [GpuMetrics(index=i, util_pct=97.5, vram_used_bytes=150_000_000_000 + i,
                       vram_total_bytes=206_158_430_208, temp_c=71.0 + i, power_w=690.5)
            for i in range(8)]
    node = node or f"gpu-{seq % 1000:04d}"
    return NodeTelemetry(source="bench", node=node, data=NodeTelemetryData(
        cpu_pct=12.5, mem_used_bytes=seq, mem_total_bytes=2 * 1024**4, load1=3.2, gpus=gpus))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def single(bus: Bus, count: int) -> list[float]:
    got: asyncio.Queue[float] = asyncio.Queue()

    async def handler(event: Event) -> None:
        await got.put(time.perf_counter())

    bus.consume(durable="bench-single", subjects=["safe.telemetry.node.>"], stream=TELEMETRY,
                handler=handler, batch=1)
    latencies = []
    for i in range(count):
        t0 = time.perf_counter()
        await bus.publish(sample_event(i))
        latencies.append((await got.get()) - t0)
    return latencies


async def burst(bus: Bus, count: int, *, batched: bool) -> tuple[float, list[float]]:
    sent: dict[str, float] = {}
    latencies: list[float] = []
    finished = asyncio.Event()

    def seen(event: Event) -> None:
        latencies.append(time.perf_counter() - sent[event.id])
        if len(latencies) == count:
            finished.set()

    async def one(event: Event) -> None:
        seen(event)

    async def many(batch: list[tuple[Event, int]]) -> None:
        for event, _ in batch:
            seen(event)

    name = "bench-batch" if batched else "bench-one"
    subject = f"safe.telemetry.node.{name}"  # an event is refused off its own subject
    if batched:
        bus.consume(durable=name, subjects=[subject], stream=TELEMETRY, batch_handler=many,
                    batch=512)
    else:
        bus.consume(durable=name, subjects=[subject], stream=TELEMETRY, handler=one, batch=512)
    events = [sample_event(i, name) for i in range(count)]
    payloads = [encode_event(e) for e in events]
    t0 = time.perf_counter()
    if batched:
        for start in range(0, count, 256):  # pipelined: up to 256 acks in flight
            chunk = range(start, min(count, start + 256))
            for i in chunk:
                sent[events[i].id] = time.perf_counter()
            await asyncio.gather(*(bus.js.publish(subject, payloads[i],
                                                  headers={"Nats-Msg-Id": events[i].id})
                                   for i in chunk))
    else:
        for i in range(count):
            sent[events[i].id] = time.perf_counter()
            await bus.js.publish(subject, payloads[i], headers={"Nats-Msg-Id": events[i].id})
    await asyncio.wait_for(finished.wait(), 120)
    return count / (time.perf_counter() - t0), latencies


async def core_baseline(bus: Bus, count: int) -> tuple[float, list[float]]:
    payload = encode_event(sample_event(0))
    latencies: list[float] = []
    got: asyncio.Queue[float] = asyncio.Queue()

    async def cb(msg: object) -> None:
        await got.put(time.perf_counter())

    sub = await bus.nc.subscribe("bench.core", cb=cb)
    for _ in range(count):
        t0 = time.perf_counter()
        await bus.nc.publish("bench.core", payload)
        latencies.append((await got.get()) - t0)
    t0 = time.perf_counter()
    for _ in range(count):
        await bus.nc.publish("bench.core", payload)
    for _ in range(count):
        await got.get()
    rate = count / (time.perf_counter() - t0)
    await sub.unsubscribe()
    return rate, latencies


async def faststream_pull(url: str, count: int, *, batch: int,
                          handler_s: float = 0.0) -> tuple[float, list[float], float]:
    """faststream's own JetStream pull subscriber on the same stream: single
    latency, burst rate, and the share of events handled out of their
    stream order for one key (``handler_s``: the handler awaits I/O that
    long, like a KV write; 0: it awaits nothing)."""
    from faststream import AckPolicy
    from faststream.nats import JStream, NatsBroker, NatsMessage, PullSub
    from nats.js import api

    broker = NatsBroker(url, logger=None)
    await broker.connect()
    name = f"fs-{batch}"
    subject = f"safe.job.{name}.checkpoint"
    seen: list[tuple[float, int]] = []
    got = asyncio.Event()
    rng = random.Random(7)
    sub = broker.subscriber(
        subject, stream=JStream("CONTROL", declare=False), durable=name,
        pull_sub=PullSub(batch_size=batch, timeout=0.5), ack_policy=AckPolicy.MANUAL,
        config=api.ConsumerConfig(name=name, durable_name=name, max_ack_pending=10_000,
                                  ack_policy=api.AckPolicy.EXPLICIT))

    @sub
    async def handle(msg: NatsMessage) -> None:
        if handler_s:
            await asyncio.sleep(rng.uniform(0, handler_s))
        seen.append((time.perf_counter(), json.loads(msg.body)["data"]["iteration"]))
        await msg.ack()
        got.set()

    await broker.start()
    bus = await Bus.connect(url, "bench")
    try:
        single: list[float] = []
        for i in range(min(count, 500)):
            got.clear()
            t0 = time.perf_counter()
            await bus.js.publish(subject, encode_event(step(name, i)))
            await got.wait()
            single.append(seen[-1][0] - t0)
        seen.clear()
        t0 = time.perf_counter()
        for i in range(count):
            await bus.js.publish(subject, encode_event(step(name, i)))
        while len(seen) < count:
            await asyncio.sleep(0.01)
        rate = count / (time.perf_counter() - t0)
        order = [s for _, s in seen]
        late = sum(1 for a, b in zip(order, order[1:], strict=False) if b < a)
        return rate, single, 100.0 * late / count
    finally:
        await bus.close()
        await broker.stop()


async def ordered_burst(bus: Bus, count: int, handler_s: float) -> tuple[float, float]:
    """The bus's own consumer with the same awaiting handler: rate and the
    share out of order (none: one event at a time, in stream order)."""
    seen: list[int] = []
    rng = random.Random(7)
    name = "raw-ordered"

    async def one(event: Event) -> None:
        await asyncio.sleep(rng.uniform(0, handler_s))
        seen.append(event.data.iteration)  # type: ignore[attr-defined]

    bus.consume(durable=name, subjects=[f"safe.job.{name}.checkpoint"], stream=CONTROL,
                handler=one, batch=64)
    t0 = time.perf_counter()
    for i in range(count):
        await bus.publish(step(name, i))
    while len(seen) < count:
        await asyncio.sleep(0.01)
    late = sum(1 for a, b in zip(seen, seen[1:], strict=False) if b < a)
    return count / (time.perf_counter() - t0), 100.0 * late / count


async def request_reply(bus: Bus, count: int) -> tuple[list[float], list[float]]:
    """Request/reply latency through the bus's typed endpoint (a faststream
    subscriber) and through a plain nats-py subscription that answers."""
    endpoint = Endpoint("safe.query.bench", Empty, Reply, "benchmark")

    async def typed(_: Empty) -> Reply:
        return Reply()

    async def raw(msg: Any) -> None:
        await msg.respond(b'{"ok": true}')

    await bus.serve(endpoint, typed)
    await bus.nc.subscribe("safe.query.raw", cb=raw)
    await bus.flush()
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(count):
        for subject, lat in (("safe.query.bench", out[0]), ("safe.query.raw", out[1])):
            t0 = time.perf_counter()
            await bus.nc.request(subject, b"{}", timeout=5)
            lat.append(time.perf_counter() - t0)
    return out


def step(job: str, seq: int) -> JobCheckpoint:
    """A small CONTROL event, numbered by its iteration."""
    return JobCheckpoint(source="bench", job=job, data=JobCheckpointData(
        attempt=1, iteration=seq, path="/ckpt", layout="sdk", saved_at=datetime.now(UTC)))


async def main(count: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()

        async def scenario(fn, *args, **kw):  # type: ignore[no-untyped-def]
            bus = await Bus.connect(server.url, "bench")  # a fresh client each
            await bus.ensure_topology()
            try:
                return await fn(bus, *args, **kw)
            finally:
                await bus.close()

        try:
            size = len(encode_event(sample_event(0)))
            base_rate, base_lat = await scenario(core_baseline, count)
            single_lat = await scenario(single, min(count, 2000))
            one_rate, one_lat = await scenario(burst, count, batched=False)
            batch_rate, batch_lat = await scenario(burst, count, batched=True)
            fs_rate, fs_single, _ = await faststream_pull(server.url, count, batch=1)
            io_count = min(count, 2000)
            fs_io_rate, _, fs_io_late = await faststream_pull(server.url, io_count, batch=64,
                                                              handler_s=IO_S)
            raw_io_rate, raw_io_late = await scenario(ordered_burst, io_count, IO_S)
            typed_rr, raw_rr = await scenario(request_reply, min(count, 2000))
        finally:
            server.stop()
    ms = 1000.0
    figures = {
        "event_bytes": size,
        "single_p50_ms": round(statistics.median(single_lat) * ms, 3),
        "single_p99_ms": round(pct(single_lat, 0.99) * ms, 3),
        "one_by_one_events_per_s": round(one_rate),
        "one_by_one_p50_ms": round(statistics.median(one_lat) * ms, 2),
        "one_by_one_p99_ms": round(pct(one_lat, 0.99) * ms, 2),
        "batched_events_per_s": round(batch_rate),
        "batched_p50_ms": round(statistics.median(batch_lat) * ms, 2),
        "batched_p99_ms": round(pct(batch_lat, 0.99) * ms, 2),
        "core_nats_p50_ms": round(statistics.median(base_lat) * ms, 3),
        "core_nats_events_per_s": round(base_rate),
        # faststream's pull subscriber keeps stream order only one message a fetch:
        "faststream_single_p50_ms": round(statistics.median(fs_single) * ms, 3),
        "faststream_one_by_one_events_per_s": round(fs_rate),
        # ...and with a batch it runs the handlers at once (an awaiting handler):
        "io_handler_ms": IO_S * ms,
        "faststream_batch64_events_per_s": round(fs_io_rate),
        "faststream_batch64_out_of_order_pct": round(fs_io_late, 1),
        "bus_ordered_events_per_s": round(raw_io_rate),
        "bus_ordered_out_of_order_pct": round(raw_io_late, 1),
        # Request/reply: the bus's typed endpoint (faststream) against plain nats-py.
        "endpoint_p50_ms": round(statistics.median(typed_rr) * ms, 3),
        "core_request_p50_ms": round(statistics.median(raw_rr) * ms, 3),
    }
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    f = asyncio.run(main(args.count))
    print(f"event size                 {f['event_bytes']} bytes")
    print(f"single publish→handler     p50 {f['single_p50_ms']} ms, p99 {f['single_p99_ms']} ms"
          f"  (core NATS p50 {f['core_nats_p50_ms']} ms)")
    print(f"burst, one-by-one handler  {f['one_by_one_events_per_s']} events/s, "
          f"p50 {f['one_by_one_p50_ms']} ms, p99 {f['one_by_one_p99_ms']} ms")
    print(f"burst, batch handler       {f['batched_events_per_s']} events/s, "
          f"p50 {f['batched_p50_ms']} ms, p99 {f['batched_p99_ms']} ms")
    print(f"core NATS (no JetStream)   {f['core_nats_events_per_s']} events/s")
    print(f"faststream pull, 1/fetch   {f['faststream_one_by_one_events_per_s']} events/s, "
          f"single p50 {f['faststream_single_p50_ms']} ms  (the only batch size that keeps "
          "stream order)")
    print(f"handler awaiting <={f['io_handler_ms']:.0f} ms:  faststream batch 64 "
          f"{f['faststream_batch64_events_per_s']} events/s with "
          f"{f['faststream_batch64_out_of_order_pct']}% out of order; the bus "
          f"{f['bus_ordered_events_per_s']} events/s, {f['bus_ordered_out_of_order_pct']}%")
    print(f"request/reply p50          {f['endpoint_p50_ms']} ms through a typed endpoint "
          f"(faststream), {f['core_request_p50_ms']} ms plain nats-py")
    print(json.dumps({
        "name": "bus_latency_single_p50", "value": f["single_p50_ms"], "unit": "ms",
        "baseline": f["core_nats_p50_ms"], "baseline_name": "core NATS pub/sub p50",
        "ratio": round(f["single_p50_ms"] / f["core_nats_p50_ms"], 2), **f}))
