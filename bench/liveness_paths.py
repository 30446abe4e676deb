"""What a heartbeat costs the NATS server, by the path it takes.

12,500 nodes beat once a second. Each path gets a fresh nats-server
(JetStream on), the agents' real heartbeat messages (a ``NodeHeartbeat``
event with its ``Nats-Msg-Id``, one subject per node) at ``--rate`` a
second for ``--seconds``, and one judge that receives every beat:

- ``CONTROL stream`` (the path before): file storage, 30 days, a 2-minute
  de-duplication window; the judge a durable pull consumer that acks each;
- ``memory stream, last beat per node``: memory storage, one message per
  subject, a 1 s window; the judge a consumer without acks;
- ``KV bucket with TTL``: what a KV bucket with per-node keys is (file
  storage, one message per subject, 10 s max age); the judge as above;
- ``core NATS`` (the path taken, ``libs/beats.py``): no stream; the judge a
  plain subscription.

Reported per path: the server's CPU per beat and per second at the rate,
and what the server keeps after the run (bytes), extrapolated to a day for
a stream that keeps everything.

    python bench/liveness_paths.py [--rate 12500] [--seconds 8]

Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from nats.js import api  # noqa: E402

from bench.lens_ingest import cpu_seconds  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.events import HeartbeatData, NodeHeartbeat, encode_event  # noqa: E402
from libs.natsfast import FastPublisher, LeanLink  # noqa: E402
from libs.pull import Puller  # noqa: E402

SLICES = 20
DAY = 86400


@dataclass(frozen=True)
class LivenessPath:
    name: str
    stream: api.StreamConfig | None  # None: core NATS
    acks: bool = True


def paths() -> tuple[LivenessPath, ...]:
    def config(**kw: object) -> api.StreamConfig:
        return api.StreamConfig(name="LIVE", subjects=["safe.live.>"], **kw)  # type: ignore[arg-type]

    return (
        LivenessPath("CONTROL stream (before)", config(
            storage=api.StorageType.FILE, max_age=30 * DAY, duplicate_window=120)),
        LivenessPath("memory stream, last beat per node", config(
            storage=api.StorageType.MEMORY, max_msgs_per_subject=1, duplicate_window=1),
            acks=False),
        LivenessPath("KV bucket with TTL", config(
            storage=api.StorageType.FILE, max_msgs_per_subject=1, max_age=10,
            duplicate_window=1), acks=False),
        LivenessPath("core NATS (taken)", None),
    )


def beats(n: int) -> list[tuple[bytes, bytes]]:
    """Each node's (subject, encoded beat)."""
    out = []
    for i in range(n):
        b = NodeHeartbeat(source=f"bench-agent:node-{i:05d}", node=f"node-{i:05d}",
                          data=HeartbeatData(seq=1, pid=1, interval_s=1.0))
        out.append((b.subject.encode(), encode_event(b)))
    return out


def burst(nodes: list[tuple[bytes, bytes]], second: int, part: int) -> bytes:
    """One twentieth of a second's beats, each with an id of its own (an
    agent's every beat is a new event: a stream must not drop it as a
    duplicate)."""
    return b"".join(FastPublisher.frame(subject, body, b"%08d-%06d" % (second, i))
                    for i, (subject, body) in enumerate(nodes) if i % SLICES == part)


async def measure(p: LivenessPath, rate: int, seconds: int, tmp: Path) -> dict[str, float]:
    server = NatsServer(tmp / p.name.split(" ")[0]).start()
    assert server.proc is not None
    nc = await nats.connect(server.url)
    heard = 0
    try:
        js = nc.jetstream()
        puller = None
        if p.stream is not None:
            await js.add_stream(p.stream)
            await js.add_consumer("LIVE", api.ConsumerConfig(
                durable_name="judge", ack_wait=30, max_ack_pending=200_000,
                ack_policy=api.AckPolicy.EXPLICIT if p.acks else api.AckPolicy.NONE))
            puller = Puller(LeanLink(nc, server.url, None, name="judge"), "LIVE", "judge")
            await puller.start()
        else:
            async def count(_: object) -> None:
                nonlocal heard
                heard += 1

            await nc.subscribe("safe.live.*.heartbeat", cb=count)
            await nc.flush()
        nodes = beats(rate)
        out = FastPublisher(server.url, name="agents")
        await out.start()
        total = rate * seconds

        async def judge() -> None:
            nonlocal heard
            while heard < total:
                assert puller is not None
                msgs = await puller.fetch(4000, fill_s=0.25)
                heard += len(msgs)
                if msgs and p.acks:
                    await puller.ack(msgs)

        task = asyncio.create_task(judge()) if puller is not None else None
        before, t0 = cpu_seconds(server.proc.pid), time.time()
        for s in range(seconds * SLICES):
            await asyncio.sleep(max(0.0, t0 + s / SLICES - time.time()))
            out.write(burst(nodes, s // SLICES, s % SLICES))
            await out.flush()
        if task is not None:
            await asyncio.wait_for(task, 120)
        else:
            deadline = time.time() + 30
            while heard < total and time.time() < deadline:
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        used = cpu_seconds(server.proc.pid) - before
        elapsed = time.time() - t0
        kept = (await js.stream_info("LIVE")).state.bytes if p.stream is not None else 0
        # A stream without a per-subject limit keeps every beat: it grows.
        keeps_all = p.stream is not None and p.stream.max_msgs_per_subject in (None, -1)
        await out.stop()
        if puller is not None:
            await puller.stop()
        return {"heard": heard, "sent": total,
                "server_cpu_us_per_beat": round(1e6 * used / total, 2),
                "server_cpu_s_per_s": round(used / elapsed, 3),
                "bytes_kept": kept,
                "bytes_per_day": round(kept / seconds * DAY) if keeps_all else kept}
    finally:
        await nc.close()
        server.stop()


async def main_async(rate: int, seconds: int) -> dict[str, dict[str, float]]:
    out = {}
    with tempfile.TemporaryDirectory(prefix="liveness-") as tmp:
        for p in paths():
            out[p.name] = r = await measure(p, rate, seconds, Path(tmp))
            print(f"{p.name:36s} {r['server_cpu_us_per_beat']:6.1f} µs/beat "
                  f"{r['server_cpu_s_per_s']:5.2f} CPU s/s, keeps {r['bytes_kept'] / 1e6:8.1f} MB"
                  f" ({r['bytes_per_day'] / 1e9:7.2f} GB/day), heard {r['heard']:,}/{r['sent']:,}",
                  flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=12_500, help="beats per second (nodes)")
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args.rate, args.seconds))
    taken, before = figures["core NATS (taken)"], figures["CONTROL stream (before)"]
    print(json.dumps({"name": "liveness_server_cpu_us_per_beat",
                      "value": taken["server_cpu_us_per_beat"], "unit": "µs/beat",
                      "ratio_to_control_stream": round(
                          taken["server_cpu_us_per_beat"]
                          / max(before["server_cpu_us_per_beat"], 1e-9), 3),
                      "rate": args.rate, "seconds": args.seconds, "paths": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
