"""A bench agent told to stop in the middle of a measurement: the measuring
thread ends at its next timed sample, the process exits within its stop
budget, and the request is measured again by the agent that comes back
(handed back at once, not after the 30-minute ack wait)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.events import BenchRequest, BenchRequestData
from libs.settings import Settings
from services.bench.agent import BenchAgent
from tests.bench_agent.stack import Stack, bench_results
from tests.helpers import wait_healthy

pytestmark = pytest.mark.timeout(300)

# Minutes of GEMM samples of 0.1 s each: without an interrupt, one level
# outlives every stop budget.
SLOW = """\
standard:
  cpu_gemm_sizes: [64]
  timing: {warmup: 1, repeats: 3000, sample_s: 0.1}
"""
FAST = """\
standard:
  cpu_gemm_sizes: [64]
  cpu_membw_bytes: 1048576
  cpu_collective_bytes: [65536]
  train_steps: 8
  timing: {warmup: 1, repeats: 3, sample_s: 0.01}
"""


def request(node: str, level: str = "standard") -> BenchRequest:
    return BenchRequest(source="test", node=node,
                        data=BenchRequestData(level=level, reason="operator"))  # type: ignore[arg-type]


async def test_a_cancelled_measurement_ends_its_thread_at_the_next_sample(
        tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(SLOW)
    agent = BenchAgent(Settings(), "n1", config_path=config)
    steps: list[str] = []
    agent._progress = lambda _, step: steps.append(step)  # type: ignore[method-assign]
    pool = ThreadPoolExecutor(thread_name_prefix="measuring")
    asyncio.get_running_loop().set_default_executor(pool)

    task = asyncio.create_task(agent._measure(request("n1"), pair_tag="t"))
    deadline = time.monotonic() + 60
    while "GEMM" not in steps and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert "GEMM" in steps, steps  # inside the minutes-long GEMM step now
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    t0 = time.monotonic()
    ended = threading.Thread(target=pool.shutdown, kwargs={"wait": True})
    ended.start()
    ended.join(10)
    assert not ended.is_alive(), "the measuring thread went on after its task was cancelled"
    assert time.monotonic() - t0 < 2  # one 0.1 s sample, not the rest of the level
    assert steps[-1] == "GEMM"  # no later step started


async def test_an_agent_stopped_mid_bench_exits_in_time_and_the_request_is_measured_after_restart(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(SLOW)
    stack = Stack(nats_url, tmp_path, config)
    results = await bench_results(bus, "safe.bench.n1.result")
    stack.start("n1", "bench-agent", "--node", "n1")
    try:
        await wait_healthy(bus, "bench-agent", "n1")
        asked = request("n1")
        await bus.publish(asked)
        deadline = time.monotonic() + 60
        while (await wait_healthy(bus, "bench-agent", "n1"))["busy"] != asked.id:
            assert time.monotonic() < deadline, "the agent never started measuring"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        t0 = time.monotonic()
        stack.procs["n1"].send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(stack.procs["n1"].wait, 30)
        stopped_in = time.monotonic() - t0
        log = (tmp_path / "n1.log").read_text()
        assert code == 0, log[-3000:]
        assert stopped_in < 15, log[-3000:]  # stop consuming (5 s) and a sample or so
        assert "threads still working at exit" not in log  # the thread ended by itself
        assert not results  # nothing was published for the abandoned run

        config.write_text(FAST)
        stack.start("n1", "bench-agent", "--node", "n1")
        deadline = time.monotonic() + 120
        while not results and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert [r.data.request_id for r in results] == [asked.id], \
            (tmp_path / "n1.log").read_text()[-3000:]
        assert results[0].data.level == "standard" and results[0].data.passed
    finally:
        codes = stack.stop()
    assert codes == {"n1": 0}
