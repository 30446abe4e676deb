"""The coordinator's repeats of a suspect, on a real nats-server with the
coordinator as a process: bench results are published as the agents would,
and the test answers the coordinator's retry requests itself, so every
figure (and so every step of the sequential test) is chosen here."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from libs.bus import CONTROL, Bus
from libs.events import (
    BenchCheck,
    BenchRequest,
    BenchResult,
    BenchResultData,
    Figure,
    parse_event,
)
from tests.bench_agent.stack import Stack
from tests.helpers import wait_healthy

pytestmark = pytest.mark.timeout(300)

UNITS = {"gemm_tflops": "TFLOPS", "triad_gbps": "GB/s", "train_tokens_per_s": "tokens/s",
         "allreduce_gbps": "GB/s"}
BASE = {"gemm_tflops": 0.065, "triad_gbps": 14.0, "train_tokens_per_s": 29000.0,
        "allreduce_gbps": 0.36}
RNG = random.Random(5)


def result(node: str, scale: float, *, request_id: str, attempt: int = 1,
           retry_of: str | None = None) -> BenchResult:
    figures = [Figure(name=n, value=v * scale * (1 + RNG.gauss(0, 0.005)), unit=UNITS[n])
               for n, v in BASE.items()]
    return BenchResult(source=f"bench-agent/{node}", node=node, data=BenchResultData(
        level="standard", request_id=request_id, passed=True, device="cpu", device_count=1,
        figures=figures, duration_s=1.0, attempt=attempt, retry_of=retry_of))


async def next_event(bus: Bus, subject: str, after: int, timeout: float = 60) -> tuple[int, object]:
    """The first event on ``subject`` stored after stream sequence ``after``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = await bus.js.get_last_msg(CONTROL.name, subject)
            if msg.seq > after:
                return msg.seq, parse_event(msg.data)
        except Exception:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"nothing new on {subject}")


async def test_an_unsure_repeat_is_measured_again_and_judged_over_the_repeats(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("fleet: {node_drop: 0.045, node_k: 2.0, retry_share: 0.5, "
                      "max_retries: 2}\n")
    stack = Stack(nats_url, tmp_path, config)
    stack.start("coordinator", "bench-coordinator")
    try:
        await wait_healthy(bus, "bench-coordinator")
        for i in range(1, 7):  # the fleet
            await bus.publish(result(f"n{i}", 1.0, request_id=f"req-n{i}"))

        async def suspect(node: str, scales: list[float]) -> BenchResult:
            """The node's first run and each repeat the coordinator asks for."""
            seq = 0
            await bus.publish(result(node, scales[0], request_id=f"req-{node}"))
            for attempt, scale in enumerate(scales[1:], start=2):
                seq, request = await next_event(bus, f"safe.bench.{node}.request", seq)
                assert isinstance(request, BenchRequest)
                assert (request.data.attempt, request.data.retry_of) == (attempt, f"req-{node}")
                await bus.publish(result(node, scale, request_id=request.id, attempt=attempt,
                                         retry_of=f"req-{node}"))
            while True:  # the coordinator's verdict on the last run
                _, verdict = await next_event(bus, f"safe.bench.{node}.result", 0)
                if isinstance(verdict, BenchResult) and verdict.data.judged_by == "coordinator":
                    return verdict
                await asyncio.sleep(0.1)

        # 10% slow, a first repeat only 3.5% low (unsure), a second 10% low.
        slow = await suspect("n7", [0.90, 0.965, 0.90])
        assert slow.data.outcome == "degraded" and slow.data.attempt == 3
        assert "over 2 repeats" in slow.data.reason, slow.data.reason
        # Low once, 3.5% low on repeat (unsure), normal the next time: healthy.
        cleared = await suspect("n8", [0.91, 0.965, 1.0])
        assert cleared.data.outcome == "healthy" and cleared.data.attempt == 3
        assert "transient" in cleared.data.reason, cleared.data.reason
        # Clearly low on the first repeat: no third run.
        clear = await suspect("n9", [0.90, 0.89])
        assert clear.data.outcome == "degraded" and clear.data.attempt == 2
    finally:
        codes = stack.stop()
    assert set(codes.values()) == {0}, codes


async def test_a_node_on_another_rocm_than_its_fleet_gets_a_drift_finding(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    """Versions travel in each run's driver_versions check; the coordinator
    holds a node's against its GPU model's fleet when it publishes its verdict."""
    config = tmp_path / "bench.yaml"
    config.write_text("fleet: {min_peers: 3}\n")
    stack = Stack(nats_url, tmp_path, config)
    stack.start("coordinator", "bench-coordinator")

    def stating(node: str, versions: str) -> BenchResult:
        plain = result(node, 1.0, request_id=f"req-{node}")
        check = BenchCheck(name="driver_versions", status="ok", detail=versions)
        return plain.model_copy(update={"data": plain.data.model_copy(
            update={"checks": [check]})})

    async def verdict(node: str) -> BenchResult:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            _, event = await next_event(bus, f"safe.bench.{node}.result", 0)
            if isinstance(event, BenchResult) and event.data.judged_by == "coordinator":
                return event
            await asyncio.sleep(0.1)
        raise AssertionError(f"no verdict on {node}")

    try:
        await wait_healthy(bus, "bench-coordinator")
        for i in range(1, 5):
            await bus.publish(stating(f"n{i}", "amdgpu 6.10.5, rocm 6.3.1"))
        await verdict("n4")
        await bus.publish(stating("odd", "amdgpu 6.10.5, rocm 6.2.0"))
        odd = await verdict("odd")
        same = await verdict("n4")
    finally:
        codes = stack.stop()
    assert set(codes.values()) == {0}, codes
    # The catalogue's entry: driver_drift, warning, report: the outcome stands.
    assert odd.data.outcome == "healthy", odd.data.reason
    assert "driver_drift (warning): rocm 6.2.0, fleet majority 6.3.1 (4 of 5 nodes)" \
        in odd.data.reason
    drift = {c.name: c for c in odd.data.checks}["driver_drift"]
    assert drift.status == "failed" and drift.detail.endswith("(reported)")
    assert "driver_drift" not in {c.name for c in same.data.checks}
