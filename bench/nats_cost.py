"""What nats-server's CPU per message depends on, at the Lens ingest rate.

The Lens ingest benchmark (``lens_ingest.py``) shares two cores between
nats-server, the collector and the load generator; this one isolates the
server. A real nats-server (JetStream) takes ``--rate`` messages a second
for ``--seconds`` into a stream, and one durable pull consumer fetches them
in batches of 4,000 and acks them, as lens-collector does (``libs.pull``
over ``libs.natsfast`` on both sides, so the client costs little). The figure is the server's CPU
(user + system, /proc) per message, for variants of one baseline: the
agents' node message (3.9 KB), a ``Nats-Msg-Id`` on every message (the
event contract's de-duplication id), file storage, an ack per message.

Each variant changes one thing: no message id, ack-all (one ack per batch),
smaller messages (1.3 KB, 400 B), memory storage. The baseline runs first
and last, so drift during the run shows.

    python bench/nats_cost.py [--rate 12500] [--seconds 6]

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
from libs.natsfast import FastPublisher, LeanLink  # noqa: E402
from libs.pull import Puller  # noqa: E402

SLICES = 20  # publish bursts per second, as lens_ingest


@dataclass(frozen=True)
class Variant:
    name: str
    size: int = 3900
    msg_id: bool = True
    ack_all: bool = False
    storage: api.StorageType = api.StorageType.FILE


VARIANTS = (
    Variant("baseline: 3.9 KB, msg id, file, ack each"),
    Variant("no Nats-Msg-Id", msg_id=False),
    Variant("ack-all (one ack per batch)", ack_all=True),
    Variant("1.3 KB messages", size=1300),
    Variant("400 B messages", size=400),
    Variant("memory storage", storage=api.StorageType.MEMORY),
    Variant("baseline again"),
)


async def measure(v: Variant, rate: int, seconds: int, tmp: Path) -> float:
    """Server CPU microseconds per message for one variant (a fresh server)."""
    server = NatsServer(tmp / v.name.split(":")[0].replace(" ", "-")).start()
    assert server.proc is not None
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="T", subjects=["t.>"], storage=v.storage, duplicate_window=30)
        await js.add_consumer("T", api.ConsumerConfig(
            durable_name="c", ack_wait=30, max_ack_pending=200_000,
            ack_policy=api.AckPolicy.ALL if v.ack_all else api.AckPolicy.EXPLICIT))
        publisher = FastPublisher(server.url, name="load")
        await publisher.start()
        puller = Puller(LeanLink(nc, server.url, None, name="cost"), "T", "c")
        await puller.start()
        total, per_slice, got = rate * seconds, rate // SLICES, 0
        payload = b"x" * v.size

        async def consume() -> None:
            nonlocal got
            while got < total:
                msgs = await puller.fetch(4000, fill_s=0.25)
                got += len(msgs)
                if msgs:
                    await puller.ack(msgs[-1:] if v.ack_all else msgs)

        before, t0 = cpu_seconds(server.proc.pid), time.time()
        task = asyncio.create_task(consume())
        for s in range(seconds * SLICES):
            await asyncio.sleep(max(0.0, t0 + s / SLICES - time.time()))
            frames = []
            for i in range(per_slice):
                subject = b"t.node.%d" % i
                if v.msg_id:
                    msg_id = b"%032d" % (s * per_slice + i)
                    frames.append(FastPublisher.frame(subject, payload, msg_id))
                else:
                    frames.append(b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload))
            publisher.write(b"".join(frames))
            await publisher.flush()
        await asyncio.wait_for(task, 120)
        await asyncio.sleep(1.0)  # acks and consumer state written
        used = cpu_seconds(server.proc.pid) - before
        await puller.stop()
        await publisher.stop()
        return 1e6 * used / total
    finally:
        await nc.close()
        server.stop()


async def main_async(rate: int, seconds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nats-cost-") as tmp:
        for v in VARIANTS:
            out[v.name] = await measure(v, rate, seconds, Path(tmp))
            print(f"{v.name:45s} {out[v.name]:6.1f} µs of nats-server CPU per message",
                  flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=12_500, help="messages per second")
    parser.add_argument("--seconds", type=int, default=6)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args.rate, args.seconds))
    base = figures[VARIANTS[0].name]
    print(json.dumps({"name": "nats_server_cpu_us_per_msg", "value": round(base, 2),
                      "unit": "µs/msg", "rate": args.rate, "seconds": args.seconds,
                      "variants": {k: round(v, 2) for k, v in figures.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
