"""Leader election beyond the scheduler: two bench-coordinator processes on a
real nats-server. Both answer health (one ``leader``, one ``standby``), only
the leader stores bench results and answers the fleet report; when it is
SIGKILLed the standby takes the lease within the TTL plus a margin, loads
the ``bench`` bucket and carries on."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from libs.bus import Bus
from libs.events import BenchResult, BenchResultData, Figure
from services.bench.protocol import REPORT
from tests.integration.test_scheduler_leader import (
    MARGIN_S,
    TTL_S,
    Replica,
    every_health,
    leader_is,
    until,
)

pytestmark = pytest.mark.timeout(180)
ROLE = "bench-coordinator"


def result(node: str, value: float) -> BenchResult:
    return BenchResult(source="test", node=node, data=BenchResultData(
        level="quick", passed=True, device="cpu", device_count=1, duration_s=0.1,
        figures=[Figure(name="gemm_tflops", unit="TFLOP/s", value=value)]))


async def test_bench_coordinator_standby_takes_over(nats_url: str, bus: Bus,
                                                     tmp_path: Any) -> None:
    a = Replica("coord-a", nats_url, tmp_path, verb=ROLE).start()
    b = Replica("coord-b", nats_url, tmp_path, verb=ROLE)
    try:
        first = await leader_is(bus, "coord-a", role=ROLE)
        b.start()
        await until(b.started, "the standby to start")
        roles = {h["holder"]: h["role"] for h in await every_health(bus, ROLE)}
        assert roles == {"coord-a": "leader", "coord-b": "standby"}
        await bus.publish(result("n1", 10.0))
        bench = await bus.kv("bench")

        async def stored() -> bool:
            try:
                return "quick" in json.loads((await bench.get("n1")).value or b"{}")["levels"]
            except Exception:
                return False

        await until(stored, "the leader to store n1's result")
        assert (await bus.request(REPORT.subject, timeout_s=5))["ok"] is True

        a.signal_kill()
        killed = time.monotonic()
        await a.wait()
        second = await leader_is(bus, "coord-b", role=ROLE, timeout=TTL_S + MARGIN_S + 5)
        assert time.monotonic() - killed <= TTL_S + MARGIN_S
        assert second["term"] > first["term"]

        async def acting() -> dict[str, Any] | None:
            replies = await every_health(bus, ROLE, wait_s=0.5)
            return replies[0] if len(replies) == 1 and replies[0]["acting"] else None

        health = await until(acting, "the new leader to load the bucket and answer", 30)
        assert health["role"] == "leader" and health["term"] == second["term"]
        assert health["nodes_with_results"] == 1  # loaded from the bucket on taking over
        await bus.publish(result("n2", 11.0))

        async def stored_n2() -> bool:
            try:
                return bool(await bench.get("n2"))
            except Exception:
                return False

        await until(stored_n2, "the new leader to store n2's result")
        assert (await bus.request(REPORT.subject, timeout_s=5))["ok"] is True
    finally:
        for replica in (a, b):
            await replica.terminate()
