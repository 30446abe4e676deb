"""The agent's telemetry sample: every GPU and the host, one message a tick.

GPU tools are slow (amd-smi takes around a second) and often absent (a CPU
node, a slim container), so GPUs are read on a worker thread that keeps the
newest reading while the 1 s tick never waits: each tick starts a read if
none is running and sends the newest one it has. Which tool answered is
remembered, so later reads run only that tool; when none works the node is
"unavailable" for ``retry_s`` and costs nothing until then.

PCIe throughput comes from the amdgpu ``pcie_bw`` sysfs file where the
driver has it (packets in and out over the last second times the maximum
payload); reading it blocks for a second, which the worker thread absorbs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from libs.events import GpuMetrics, NodeTelemetryData
from libs.gpu import GpuInventory, GpuSample, ProbeResult, probe_gpus, read_amdgpu_sysfs
from libs.logs import get_logger
from services.bench.host_metrics import HostSampler

Probe = Callable[..., ProbeResult]
TOOLS: tuple[str, ...] = ("amd-smi", "rocm-smi", "nvidia-smi")
_CARD = re.compile(r"^card\d+$")


class GpuSource:
    """Reads this node's GPUs with whichever tool works, remembering which."""

    def __init__(self, *, probe: Probe = probe_gpus, sysfs_root: str | os.PathLike[str] = "/",
                 tools: Sequence[str] = TOOLS, timeout_s: float = 5.0, retry_s: float = 300.0,
                 pcie_bw: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.probe, self.sysfs_root, self.tools = probe, sysfs_root, tuple(tools)
        self.timeout_s, self.retry_s, self.pcie_bw, self.clock = timeout_s, retry_s, pcie_bw, clock
        self.tool: str | None = None
        self.reason: str | None = None
        self.probes = 0
        self._retry_at = float("-inf")
        self._log = get_logger(component="gpu-source")

    def read(self) -> tuple[str | None, list[GpuMetrics]]:
        """(tool, GPUs); (None, []) while no tool works, without trying again before
        ``retry_s`` has passed."""
        if self.tool is None and self.clock() < self._retry_at:
            return None, []
        inventory = self._inventory()
        if inventory is None:
            return None, []
        pcie = _pcie_by_bus(self.sysfs_root) if self.pcie_bw else {}
        return self.tool, [to_metrics(g, pcie.get(_bus(g.pci_bus))) for g in inventory.gpus]

    def _inventory(self) -> GpuInventory | None:
        self.probes += 1
        if self.tool == "sysfs":
            found = read_amdgpu_sysfs(self.sysfs_root)
            if found.gpus:
                return found
        elif self.tool is not None:
            result = self.probe((self.tool,), self.timeout_s, sysfs_root=None)
            if result.status == "ok" and result.inventory is not None:
                return result.inventory
        result = self.probe(self.tools, self.timeout_s, sysfs_root=self.sysfs_root)
        if result.status == "ok" and result.inventory is not None:
            if result.tool != self.tool:
                self._log.info("gpu tool found", tool=result.tool, gpus=len(result.inventory.gpus))
            self.tool, self.reason = result.tool, None
            return result.inventory
        if self.reason != result.reason:
            self._log.info("no gpu tool answers", status=result.status, reason=result.reason,
                           retry_s=self.retry_s)
        self.tool, self.reason = None, result.reason
        self._retry_at = self.clock() + self.retry_s
        return None


def to_metrics(g: GpuSample, pcie: tuple[float, float] | None = None) -> GpuMetrics:
    return GpuMetrics(
        index=g.index, util_pct=g.utilization_pct, vram_used_bytes=g.vram_used_bytes,
        vram_total_bytes=g.vram_total_bytes, temp_c=g.temp_edge_c,
        temp_junction_c=g.temp_junction_c, temp_hbm_c=g.temp_memory_c, power_w=g.power_w,
        power_cap_w=g.power_cap_w, sclk_mhz=g.sclk_mhz, mclk_mhz=g.mclk_mhz,
        ecc_correctable=g.ecc_correctable, ecc_uncorrectable=g.ecc_uncorrectable,
        pcie_rx_bytes_s=pcie[0] if pcie else None, pcie_tx_bytes_s=pcie[1] if pcie else None)


def _bus(pci_bus: str | None) -> str:
    """A PCI address in one spelling: ``0000:83:00.0``, lower case."""
    if not pci_bus:
        return ""
    bus = pci_bus.strip().lower()
    return bus if bus.count(":") == 2 else f"0000:{bus}"


def _pcie_by_bus(root: str | os.PathLike[str]) -> dict[str, tuple[float, float]]:
    """Bytes/s received and sent per AMD GPU's PCI address, from ``pcie_bw``."""
    drm = Path(root) / "sys" / "class" / "drm"
    try:
        cards = [drm / n / "device" for n in sorted(os.listdir(drm)) if _CARD.match(n)]
    except OSError:
        return {}
    files = [c / "pcie_bw" for c in cards if (c / "pcie_bw").exists()]
    if not files:
        return {}
    with ThreadPoolExecutor(max_workers=len(files)) as pool:  # each read blocks ~1 s
        texts = list(pool.map(_read, files))
    out = {}
    for path, text in zip(files, texts, strict=True):
        parts = text.split()
        if len(parts) >= 3:
            with contextlib.suppress(ValueError):
                received, sent, payload = (int(p) for p in parts[:3])
                out[_bus(os.path.basename(os.path.realpath(path.parent)))] = (
                    float(received * payload), float(sent * payload))
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class NodeSampler:
    """One ``NodeTelemetryData`` per call; GPUs from the newest finished read."""

    def __init__(self, *, host: HostSampler | None = None, gpus: GpuSource | None = None,
                 first_wait_s: float = 2.0) -> None:
        self.host = host or HostSampler()
        self.gpus = gpus or GpuSource()
        self.first_wait_s = first_wait_s
        self._tool: str | None = None
        self._latest: list[GpuMetrics] = []
        self._reading: asyncio.Future[tuple[str | None, list[GpuMetrics]]] | None = None
        self._read_once = False
        self.host.sample()  # prime the counters: the first rates are then real

    async def sample(self) -> NodeTelemetryData:
        self._collect()
        if self._reading is None:
            self._reading = asyncio.get_running_loop().run_in_executor(None, self.gpus.read)
        if not self._read_once:  # the first message should carry the GPUs if it can
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reading), self.first_wait_s)
        self._collect()
        host = self.host.sample()
        return NodeTelemetryData(
            cpu_pct=host.cpu_pct, mem_used_bytes=host.mem_used_bytes,
            mem_total_bytes=host.mem_total_bytes, load1=host.load1, gpus=list(self._latest),
            gpu_tool=self._tool, nics=host.nics, disks=host.disks,
            filesystems=host.filesystems)

    def _collect(self) -> None:
        if self._reading is not None and self._reading.done():
            self._read_once = True
            try:
                self._tool, self._latest = self._reading.result()
            except Exception as exc:  # a parser bug must not stop telemetry
                get_logger(component="gpu-source").warning("gpu read failed", error=repr(exc))
                self._tool, self._latest = None, []
            self._reading = None
