"""The bench agent's /metrics page: GPU readings under the exporters' names
and labels, host readings, the agent's counts and the shell's bus figures.

The renderer is checked on real recorded tool outputs (tests/gpu/fixtures),
the page parsed back with prometheus-client's own parser; then real agent
processes (a fake ``amd-smi`` or ``nvidia-smi`` on PATH printing recorded
outputs) are scraped over HTTP, one of them behind a GPU tool that takes 3 s
a read, which neither the 0.5 s telemetry ticks nor a scrape may wait for.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from libs.bus import Bus
from libs.events import DiskMetrics, FsMetrics, NicMetrics, NodeTelemetryData
from libs.gpu import GpuInventory, parse_amd_smi_json, parse_nvidia_smi_xml, parse_rocm_smi
from services.bench.exporter_names import MIB, GpuIdentity, PageSample, render
from services.bench.node_sampler import to_metrics
from services.bench.placements import Owner, attributed
from tests.bench_agent.stack import Stack
from tests.helpers import wait_healthy

pytestmark = pytest.mark.timeout(120)

GPU_FIXTURES = Path(__file__).parents[1] / "gpu" / "fixtures"
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sample(inventory: GpuInventory, tool: str, owners: dict[int, Owner] | None = None,
           taken_at: float = 100.0) -> PageSample:
    """The agent's last sample from one recorded inventory, as its telemetry loop keeps it."""
    data = NodeTelemetryData(
        cpu_pct=12.5, mem_used_bytes=3 << 30, mem_total_bytes=16 << 30, load1=0.75,
        gpus=[to_metrics(g) for g in inventory.gpus], gpu_tool=tool,
        nics=[NicMetrics(name="eth0", rx_bytes_s=1000.0, tx_bytes_s=2000.0),
              NicMetrics(name="mlx5_0:1", rx_bytes_s=5e9, tx_bytes_s=4e9, rdma=True)],
        disks=[DiskMetrics(name="nvme0n1", read_bytes_s=4096.0, write_bytes_s=8192.0)],
        filesystems=[FsMetrics(mount="/", free_bytes=10 << 30, total_bytes=100 << 30)])
    identities = {g.index: GpuIdentity(index=g.index, uuid=g.uuid, serial=g.serial,
                                       pci_bus=g.pci_bus, name=g.name) for g in inventory.gpus}
    return PageSample(data=attributed(data, owners or {}), identities=identities, tool=tool,
                      taken_at=taken_at)


def page(families: list[Metric]) -> str:
    """The text a scrape gets, written by prometheus-client."""

    class Page:
        def collect(self) -> Iterator[Metric]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Page())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def parsed(text: str) -> tuple[dict[str, str], Series]:
    """(family -> type, (sample name, sorted labels) -> value), read back by the parser."""
    kinds, series = {}, {}
    for family in text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for s in family.samples:
            series[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return kinds, series


def find(series: Series, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {k: v for (n, k), v in series.items()
            if n == name and all(dict(k).get(a) == b for a, b in labels.items())}


def one(series: Series, name: str, **labels: str) -> float:
    found = find(series, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def test_rocm_smi_mi100_under_amd_names_with_the_job_of_each_gpu() -> None:
    inventory = parse_rocm_smi((GPU_FIXTURES / "rocm_smi_showallinfo_mi100x4.json").read_text())
    taken = sample(inventory, "rocm-smi", owners={1: Owner("train-a", 2, 3)})
    kinds, series = parsed(page(render(taken, "node-7", now=104.5)))

    assert all(kinds[n] == "gauge" for n in ("gpu_gfx_activity", "gpu_used_vram", "gpu_clock"))
    gpu0 = dict(next(iter(find(series, "gpu_gfx_activity", gpu_id="0"))))
    assert gpu0 == {"gpu_id": "0", "gpu_uuid": "0x79ccd55167a2124a", "serial_number": "",
                    "card_series": "Arcturus GL-XL [Instinct MI100]",
                    "card_model": "Arcturus GL-XL [Instinct MI100]", "hostname": "node-7",
                    "job_id": "", "rank": ""}
    assert one(series, "gpu_gfx_activity", gpu_id="1", job_id="train-a", rank="3") == 0.0
    assert len(find(series, "gpu_junction_temperature")) == 4
    assert one(series, "gpu_used_vram", gpu_id="0") == 6750208 / MIB  # MB of 2**20 bytes
    assert one(series, "gpu_total_vram", gpu_id="0") == 34342961152 / MIB
    assert one(series, "gpu_free_vram", gpu_id="0") == (34342961152 - 6750208) / MIB
    assert one(series, "gpu_edge_temperature", gpu_id="0") == 53.0
    assert one(series, "gpu_junction_temperature", gpu_id="0") == 55.0
    assert one(series, "gpu_memory_temperature", gpu_id="0") == 53.0
    assert one(series, "gpu_package_power", gpu_id="0") == 36.0
    assert one(series, "gpu_clock", gpu_id="0", clock_type="system", clock_index="0") == 300.0
    assert one(series, "gpu_clock", gpu_id="0", clock_type="memory") == 1200.0
    assert one(series, "primus_gpu_power_cap_watts", gpu_id="0", hostname="node-7") == 290.0
    assert not find(series, "DCGM_FI_DEV_GPU_UTIL")
    assert not find(series, "gpu_ecc_correct_total")  # rocm-smi gave none: absent, never 0
    assert one(series, "primus_telemetry_sample_age_seconds") == 4.5


def test_amd_smi_static_gives_the_serial_number_and_card_model() -> None:
    inventory = parse_amd_smi_json((GPU_FIXTURES / "amd_smi_static_mi210.json").read_text())
    _, series = parsed(page(render(sample(inventory, "amd-smi"), "mi210-node", now=100.0)))
    labels = dict(next(iter(find(series, "gpu_total_vram"))))
    assert labels["serial_number"] == "0" and labels["card_model"] == "AMD Instinct MI210"
    assert one(series, "gpu_total_vram") == 68702699520 / MIB
    assert one(series, "gpu_clock", clock_type="system") == 800.0


def test_amd_smi_metric_and_static_rx6600_every_reading() -> None:
    metric = parse_amd_smi_json((GPU_FIXTURES / "amd_smi_metric_rx6600.json").read_text())
    static = parse_amd_smi_json((GPU_FIXTURES / "amd_smi_static_rx6600.json").read_text())
    taken = sample(metric.merged_with(static), "amd-smi")
    _, series = parsed(page(render(taken, "desk", now=100.0)))
    assert one(series, "gpu_gfx_activity") == 1.0
    assert one(series, "gpu_used_vram") == 211812352 / MIB
    assert one(series, "gpu_junction_temperature") == 37.0
    assert one(series, "gpu_ecc_correct_total") == 0.0
    assert one(series, "gpu_ecc_uncorrect_total") == 0.0
    assert one(series, "gpu_package_power") == 6.0
    assert dict(next(iter(find(series, "gpu_package_power"))))["hostname"] == "desk"


def test_nvidia_smi_a100_under_dcgm_exporter_names() -> None:
    inventory = parse_nvidia_smi_xml((GPU_FIXTURES / "nvidia_smi_q_x_a100_sxm4.xml").read_text())
    taken = sample(inventory, "nvidia-smi", owners={0: Owner("llm", 1, 0)})
    _, series = parsed(page(render(taken, "dgx-1", now=100.0)))

    labels = dict(next(iter(find(series, "DCGM_FI_DEV_FB_USED"))))
    assert labels == {"gpu": "0", "UUID": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
                      "pci_bus_id": "00000000:01:00.0", "device": "nvidia0",
                      "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "dgx-1",
                      "job_id": "llm", "rank": "0"}
    assert one(series, "DCGM_FI_DEV_FB_USED") == 50.0  # MiB
    assert one(series, "DCGM_FI_DEV_FB_FREE") == (85899345920 - 52428800) / MIB
    assert one(series, "DCGM_FI_DEV_GPU_TEMP") == 27.0
    assert one(series, "DCGM_FI_DEV_MEMORY_TEMP") == 44.0
    assert one(series, "DCGM_FI_DEV_POWER_USAGE") == 67.03
    assert one(series, "DCGM_FI_DEV_SM_CLOCK") == 1275.0
    assert one(series, "DCGM_FI_DEV_MEM_CLOCK") == 1593.0
    assert one(series, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == 0.0
    assert one(series, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 0.0
    assert one(series, "primus_gpu_vram_total_bytes") == 85899345920  # no DCGM name: bytes
    assert one(series, "primus_gpu_power_cap_watts") == 500.0
    assert not find(series, "DCGM_FI_DEV_GPU_UTIL")  # MIG mode: nvidia-smi gave no utilization
    assert not find(series, "gpu_gfx_activity")
    # The setting can ask for AMD's names whatever the tool.
    _, amd = parsed(page(render(taken, "dgx-1", choice="amd", now=100.0)))
    assert one(amd, "gpu_used_vram", gpu_id="0", job_id="llm") == 50.0


def test_host_readings_and_no_page_before_the_first_sample() -> None:
    inventory = parse_rocm_smi((GPU_FIXTURES / "rocm_smi_showallinfo_mi100x4.json").read_text())
    _, series = parsed(page(render(sample(inventory, "rocm-smi"), "node-7", now=100.0)))
    assert one(series, "primus_host_cpu_busy_percent", hostname="node-7") == 12.5
    assert one(series, "primus_host_memory_used_bytes") == 3 << 30
    assert one(series, "primus_host_memory_total_bytes") == 16 << 30
    assert one(series, "primus_host_load1") == 0.75
    assert one(series, "primus_host_network_receive_bytes_per_second", device="mlx5_0:1",
               rdma="true") == 5e9
    assert one(series, "primus_host_network_transmit_bytes_per_second", device="eth0",
               rdma="false") == 2000.0
    assert one(series, "primus_host_disk_read_bytes_per_second", device="nvme0n1") == 4096.0
    assert one(series, "primus_host_disk_written_bytes_per_second") == 8192.0
    assert one(series, "primus_host_filesystem_avail_bytes", mountpoint="/") == 10 << 30
    assert one(series, "primus_host_filesystem_size_bytes", mountpoint="/") == 100 << 30
    assert render(None, "node-7", now=1.0) == []
    # A node without a GPU tool: host readings only.
    bare = PageSample(data=NodeTelemetryData(cpu_pct=1, mem_used_bytes=1, mem_total_bytes=2,
                                             load1=0), identities={}, tool=None, taken_at=0)
    names = {m.name for m in render(bare, "cpu-node", now=1.0)}
    assert names and all(n.startswith("primus_") for n in names)


# ---------------------------------------------------------------------- agent processes


def fake_tool(bin_dir: Path, name: str, outputs: dict[str, Path], *, delay_s: float = 0) -> None:
    """``name`` on PATH printing a recorded output per first argument ("" for
    any), after ``delay_s``; other commands fail, as on a host without them."""
    bin_dir.mkdir(exist_ok=True)
    table = {arg: str(path) for arg, path in outputs.items()}
    tool = bin_dir / name
    tool.write_text(f"""#!{sys.executable}
import sys, time
outputs = {table!r}
path = outputs.get(sys.argv[1] if len(sys.argv) > 1 else "", outputs.get(""))
if path is None:
    sys.exit("unsupported: " + " ".join(sys.argv[1:]))
time.sleep({delay_s!r})
sys.stdout.write(open(path).read())
""")
    tool.chmod(0o755)


def scrape(port: int) -> tuple[str, float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return text, time.monotonic() - started


async def scrape_until(port: int, name: str, deadline_s: float = 30) -> tuple[str, float]:
    deadline = time.monotonic() + deadline_s
    while True:
        text, took = await asyncio.to_thread(scrape, port)
        if any(f.name == name for f in text_string_to_metric_families(text)) \
                or time.monotonic() > deadline:
            return text, took
        await asyncio.sleep(0.3)


def agent_stack(nats_url: str, tmp_path: Path, **env: str) -> Stack:
    config = tmp_path / "bench.yaml"
    config.write_text("probes: []\n")
    stack = Stack(nats_url, tmp_path, config,
                  path=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    stack.env.update(PRIMUS_METRICS_PORT="0", PRIMUS_METRICS_HOST="127.0.0.1", **env)
    return stack


async def test_an_agent_on_an_amd_smi_node_serves_amd_names_and_bus_figures(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "amd-smi",
              {"metric": GPU_FIXTURES / "amd_smi_metric_rx6600.json",
               "static": GPU_FIXTURES / "amd_smi_static_rx6600.json"})
    stack = agent_stack(nats_url, tmp_path)
    stack.start("amdnode", "bench-agent", "--node", "amdnode")
    try:
        health: dict[str, Any] = await wait_healthy(bus, "bench-agent", "amdnode")
        port = health["metrics_port"]
        assert isinstance(port, int) and port > 0, health
        text, _ = await scrape_until(port, "gpu_gfx_activity")
        kinds, series = parsed(text)
        assert one(series, "gpu_gfx_activity", gpu_id="0", hostname="amdnode",
                   job_id="", rank="") == 1.0, text[-3000:]
        assert one(series, "gpu_used_vram", gpu_id="0") == 211812352 / MIB
        labels = dict(next(iter(find(series, "gpu_gfx_activity"))))
        assert labels["card_model"] == "Navi 23 [Radeon RX 6600/6600 XT"
        assert one(series, "primus_host_memory_total_bytes") > 0
        # The shell's figures and the agent's own, on the same page.
        assert {"primus_messages_handled", "primus_service_info", "primus_bench_results",
                "primus_bench_probe_runs", "primus_consumer_pending"} <= set(kinds)
        assert one(series, "primus_service_info", service="bench-agent", node="amdnode") == 1
    finally:
        codes = stack.stop()
    assert codes == {"amdnode": 0}


async def test_a_slow_gpu_tool_slows_neither_telemetry_nor_a_scrape(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    fake_tool(tmp_path / "bin", "nvidia-smi",
              {"": GPU_FIXTURES / "nvidia_smi_query_tesla_p100_header.csv"}, delay_s=3.0)
    arrivals: list[float] = []

    async def on_telemetry(_: object) -> None:
        arrivals.append(time.monotonic())

    await bus.nc.subscribe("safe.telemetry.node.slow", cb=on_telemetry)
    stack = agent_stack(nats_url, tmp_path, PRIMUS_TELEMETRY_INTERVAL_S="0.5")
    stack.start("slow", "bench-agent", "--node", "slow")
    try:
        port = (await wait_healthy(bus, "bench-agent", "slow"))["metrics_port"]
        text, _ = await scrape_until(port, "DCGM_FI_DEV_GPU_TEMP")
        _, series = parsed(text)
        assert one(series, "DCGM_FI_DEV_GPU_TEMP", gpu="0", device="nvidia0",
                   modelName="Tesla P100-PCIE-16GB", Hostname="slow") == 37.0, text[-2000:]
        assert one(series, "DCGM_FI_DEV_POWER_USAGE") == 28.16
        # Each read takes 3 s and another starts at once: the worker thread is
        # always busy, and the ticks and the scrapes go on regardless.
        took = [(await asyncio.to_thread(scrape, port))[1] for _ in range(5)]
        assert max(took) < 0.5, took
        first = len(arrivals)
        await asyncio.sleep(3.5)
        ticks = arrivals[first - 1:]
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
        assert len(ticks) >= 6 and max(gaps) < 1.2, gaps
    finally:
        codes = stack.stop()
    assert codes == {"slow": 0}
