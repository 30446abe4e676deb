"""Failover time to recovery in the embedded stack, split into its phases.

Each run starts the embedded stack (real nats-server, chDB, the five
services, 4 local nodes), trains ``examples/job.yaml``'s two-worker DDP job,
SIGKILLs one of its nodes (agent and workers) right after the first complete
checkpoint, and reads failover's fault record: from the kill to detection
(fault opened), mitigation (node quarantined), re-placement (the gang placed on
healthy nodes) and the first training step after restart. Medians and p95
over the runs, against the stock Kubernetes path (node-monitor grace period
40 s + default eviction toleration 300 s before pods even move).

    python bench/failover_mttr.py [--runs 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.client import read_bucket, submit  # noqa: E402
from libs.bus import Bus  # noqa: E402
from libs.embedded import EmbeddedStack  # noqa: E402
from libs.records import FAULTS, JOBS, NODES, FaultRecord, JobRecord  # noqa: E402
from libs.sdk import latest_complete_checkpoint  # noqa: E402

STOCK_KUBERNETES_S = 40.0 + 300.0
PHASES = ("detection", "mitigation", "replacement", "first_step")


async def until(fn: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await fn()
        if value:
            return value
        await asyncio.sleep(every)
    raise TimeoutError("the run did not get there in time")


async def one_run(stack: EmbeddedStack) -> dict[str, float]:
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "bench", token=stack.nats.token)
    try:
        async def ready() -> bool:
            nodes = await read_bucket(bus, NODES, missing_ok=True)
            return len(nodes) == len(stack.node_names) and all(
                n.state == "ready" for n in nodes.values())

        await until(ready, 180, 0.3)
        job = await submit(str(ROOT / "examples" / "job.yaml"))

        async def placed() -> JobRecord | None:
            record = (await read_bucket(bus, JOBS, missing_ok=True)).get(job)
            return record if record is not None and record.status == "running" else None

        record = await until(placed, 60)
        ckpt_dir = stack.state_dir / "checkpoints" / job

        async def checkpointed() -> Any:
            return latest_complete_checkpoint(ckpt_dir, len(record.slots))

        await until(checkpointed, 120)
        victim = record.nodes[-1]
        killed = time.time()
        stack.kill_node(victim)

        async def recovered() -> FaultRecord | None:
            faults = await read_bucket(bus, FAULTS, missing_ok=True)
            return next((f for f in faults.values() if f.key == victim and f.first_step_at),
                        None)

        fault = await until(recovered, 120, 0.2)
    finally:
        await bus.close()
    assert fault.mitigated_at is not None
    return {
        "detection": fault.opened_at - killed,
        "mitigation": fault.mitigated_at - killed,
        "replacement": min(fault.replaced_at.values()) - killed,
        "first_step": max(fault.first_step_at.values()) - killed,
    }


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile by nearest rank (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    os.environ.pop("PRIMUS_NATS_URL", None)
    runs: list[dict[str, float]] = []
    for i in range(args.runs):
        state = Path(tempfile.mkdtemp(prefix="mttr-"))
        os.environ["PRIMUS_STATE_DIR"] = str(state)  # submit() finds the stack here
        stack = EmbeddedStack(state, nodes=4).start()
        try:
            run = asyncio.run(one_run(stack))
        finally:
            stack.stop()
            shutil.rmtree(state, ignore_errors=True)
        runs.append(run)
        print(f"run {i + 1}: " + ", ".join(f"{p} {run[p]:.2f} s" for p in PHASES), flush=True)
    figures: dict[str, float] = {}
    for p in PHASES:
        values = [r[p] for r in runs]
        figures[f"{p}_median_s"] = round(statistics.median(values), 3)
        figures[f"{p}_p95_s"] = round(pct(values, 0.95), 3)
    figures["replacement_after_detection_median_s"] = round(statistics.median(
        [r["replacement"] - r["detection"] for r in runs]), 3)
    print(f"\nover {len(runs)} runs, seconds from the kill:")
    for p in PHASES:
        median, p95 = figures[f"{p}_median_s"], figures[f"{p}_p95_s"]
        print(f"  {p:<12} median {median:7.2f}   p95 {p95:7.2f}")
    print(f"  re-placement after detection, median "
          f"{figures['replacement_after_detection_median_s']:.2f} s")
    ratio = STOCK_KUBERNETES_S / figures["first_step_median_s"]
    print(f"  stock Kubernetes moves pods after ~{STOCK_KUBERNETES_S:.0f} s: "
          f"{ratio:.1f}x slower than the first step here")
    print(json.dumps({"name": "failover_mttr_first_step_median", "unit": "s",
                      "value": figures["first_step_median_s"], "baseline": STOCK_KUBERNETES_S,
                      "baseline_name": "stock Kubernetes pod eviction (40 s + 300 s)",
                      "ratio": round(ratio, 2), "runs": len(runs), **figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
