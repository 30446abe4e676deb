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
network path. Ends with one JSON line.

    python bench/bus_latency.py [--count 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.bus import CONTROL, TELEMETRY, Bus  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.events import Event, GpuMetrics, NodeTelemetry, NodeTelemetryData, encode_event  # noqa: E402


def sample_event(seq: int) -> NodeTelemetry:
    gpus = [GpuMetrics(index=i, util_pct=97.5, vram_used_bytes=150_000_000_000 + i,
                       vram_total_bytes=206_158_430_208, temp_c=71.0 + i, power_w=690.5)
            for i in range(8)]
    return NodeTelemetry(source="bench", node=f"gpu-{seq % 1000:04d}", data=NodeTelemetryData(
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
    subject = f"safe.node.{name}.heartbeat"
    if batched:
        bus.consume(durable=name, subjects=[subject], stream=CONTROL, batch_handler=many,
                    batch=512)
    else:
        bus.consume(durable=name, subjects=[subject], stream=CONTROL, handler=one, batch=512)
    events = [sample_event(i) for i in range(count)]
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
    print(json.dumps({
        "name": "bus_latency_single_p50", "value": f["single_p50_ms"], "unit": "ms",
        "baseline": f["core_nats_p50_ms"], "baseline_name": "core NATS pub/sub p50",
        "ratio": round(f["single_p50_ms"] / f["core_nats_p50_ms"], 2), **f}))
