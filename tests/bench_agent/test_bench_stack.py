"""The bench service with real parts: a nats-server, the coordinator and
agents as processes (tiny standard level), driven through the CLI and the
coordinator's queries.

One scenario walks the whole path: standard runs and the fleet verdict, the
report, a sweep with turn-taking, the full level's pairing with a healthy
partner, and the split search finding a node that cannot join a collective.
Another shows a periodic probe (from a config file loaded while the agent
runs) failing on a hot GPU reported by a fake nvidia-smi.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from libs.bus import Bus
from services.bench.protocol import SEARCH, SWEEP
from tests.bench_agent.stack import Stack, bench_results
from tests.helpers import wait_healthy

pytestmark = pytest.mark.timeout(600)

CONFIG = """\
standard:
  cpu_gemm_sizes: [64]
  cpu_membw_bytes: 1048576
  cpu_collective_bytes: [65536]
  train_steps: 8
  timing: {warmup: 1, repeats: 3, sample_s: 0.01}
full:
  rendezvous_timeout_s: 5
fleet:
  node_drop: 0.5
  figure_drop: 0.9
  fail_drop: 0.95
"""


async def test_standard_verdicts_sweep_pairing_and_split_search(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(CONFIG)
    stack = Stack(nats_url, tmp_path, config)
    nodes = [f"n{i}" for i in range(1, 6)]
    stack.start("coordinator", "bench-coordinator")
    for node in nodes:
        stack.start(node, "bench-agent", "--node", node)
    try:
        for node in nodes:
            await wait_healthy(bus, "bench-agent", node)
        await wait_healthy(bus, "bench-coordinator")

        # Standard runs one by one through the CLI: the last ones have peers.
        for node in nodes[:4]:
            ran = await asyncio.to_thread(stack.cli, "bench", "run", "--node", node,
                                          "--level", "standard", "--json")
            assert ran.returncode == 0, ran.stderr[-2000:]
            result = json.loads(ran.stdout)["data"]
            assert result["judged_by"] == "coordinator" and result["outcome"] == "healthy"
            assert all(f["unit"] for f in result["figures"])
        assert "within the fleet" in result["reason"]  # n4 had three peers
        shown = await asyncio.to_thread(stack.cli, "bench", "run", "--node", "n5",
                                        "--level", "standard")
        assert shown.returncode == 0 and "fleet verdict" in shown.stderr
        assert "gemm_fp32_64_tflops" in shown.stdout and "gemm_bf16_fp16" in shown.stdout

        report = json.loads((await asyncio.to_thread(stack.cli, "bench", "report",
                                                     "--json")).stdout)
        assert {r["node"] for r in report} >= set(nodes)
        assert [r["relative"] for r in report] == sorted(r["relative"] for r in report)
        assert all(r["unit"] and r["level"] for r in report)

        # A sweep: the nodes take turns sample by sample and are judged together.
        swept = await bus.request(SWEEP.subject, {"nodes": nodes, "level": "standard",
                                                  "turns": True}, timeout_s=300)
        assert swept["ok"] and set(swept["verdicts"]) == set(nodes) and swept["missing"] == []
        assert {v["outcome"] for v in swept["verdicts"].values()} == {"healthy"}

        # Full level: the coordinator pairs n1 with a node proven healthy.
        full = await asyncio.to_thread(stack.cli, "bench", "run", "--node", "n1",
                                       "--level", "full", "--json")
        assert full.returncode == 0, full.stderr[-2000:]
        data = json.loads(full.stdout)["data"]
        checks = {c["name"]: c for c in data["checks"]}
        assert checks["inter_node_collectives"]["status"] == "ok"
        assert any(f["name"].startswith("internode_allreduce") for f in data["figures"])

        # n5 dies: a collective over n2..n5 fails; the search finds n5.
        stack.procs["n5"].send_signal(signal.SIGKILL)
        stack.procs.pop("n5").wait()
        found = await bus.request(SEARCH.subject, {"nodes": ["n2", "n3", "n4", "n5"],
                                                   "healthy": ["n1"]}, timeout_s=400)
        assert found["ok"] and found["bad"] == ["n5"], found
        assert found["rounds"] == 2 and set(found["cleared"]) == {"n2", "n3", "n4"}
    finally:
        codes = stack.stop()
    assert set(codes.values()) == {0}, codes


def fake_nvidia_smi(bin_dir: Path, temp_c: int) -> None:
    bin_dir.mkdir(exist_ok=True)
    row = (f"0, GPU-1, Tesla T4, 5, 100, 15360, {temp_c}, N/A, 30.0, 70.0, 1590, 5000, "
           "0, 0, 3, 16")
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!{sys.executable}\nprint({row!r})\n")
    tool.chmod(0o755)


async def test_a_probe_from_a_reloaded_config_reports_a_hot_gpu_after_n_failures(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("probes: []\n")
    fake_nvidia_smi(tmp_path / "bin", temp_c=101)
    stack = Stack(nats_url, tmp_path, config,
                  path=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    results = await bench_results(bus, "safe.bench.hot.result")
    stack.start("hot", "bench-agent", "--node", "hot")
    try:
        await wait_healthy(bus, "bench-agent", "hot")
        config.write_text("probes:\n  - {name: temp, kind: gpu_temperature, interval_s: 0.5,\n"
                          "     timeout_s: 20, failures_before_report: 3}\n")
        deadline = time.monotonic() + 60
        while not results and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        assert results, (tmp_path / "hot.log").read_text()[-3000:]
        data = results[0].data
        assert data.trigger == "probe" and not data.passed and data.outcome == "failed"
        assert "temp failed 3 time(s) in a row" in data.reason and "101 °C > 95 °C" in data.reason
        state = (await wait_healthy(bus, "bench-agent", "hot"))["probes"]["temp"]
        assert state["reported"] is True and state["consecutive_failures"] >= 3
        await asyncio.sleep(2)
        assert len(results) == 1  # once per failing streak
    finally:
        codes = stack.stop()
    assert codes == {"hot": 0}
