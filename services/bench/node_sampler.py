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

Each inventory's GPU identities (UUID, serial, PCI address, model) are kept
per index beside the readings: the telemetry contract carries only the index,
and the agent's /metrics page labels GPUs the way the exporters do.

XGMI throughput comes from ``amd-smi xgmi --metric --json`` (older releases:
``-m``), run only when amd-smi is the tool that answered and alongside the
``pcie_bw`` read. amd-smi gives bytes moved since the driver loaded, so a rate
needs two readings: the first after start (or after a counter went backwards)
carries none. Where the command fails or reports no XGMI links (PCIe-only
boxes, consumer cards) it is left alone for ``retry_s``, like a missing tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from libs.events import GpuMetrics, NodeTelemetryData
from libs.gpu import (
    GpuInventory,
    GpuSample,
    ProbeResult,
    XgmiTotals,
    parse_amd_smi_xgmi_json,
    probe_gpus,
    read_amdgpu_sysfs,
    xgmi_rates,
)
from libs.logs import get_logger
from services.bench.exporter_names import GpuIdentity
from services.bench.host_metrics import HostSampler

Probe = Callable[..., ProbeResult]
# Runs `amd-smi xgmi --metric --json` within the timeout and returns its stdout;
# raises XgmiUnavailable when it cannot.
XgmiRun = Callable[[float], str]
TOOLS: tuple[str, ...] = ("amd-smi", "rocm-smi", "nvidia-smi")
_CARD = re.compile(r"^card\d+$")
XGMI_ARGS: tuple[tuple[str, ...], ...] = (("xgmi", "--metric", "--json"), ("xgmi", "-m", "--json"))


class XgmiUnavailable(Exception):
    """amd-smi gave no XGMI counters: not on PATH, timed out, or exited non-zero."""


class AmdSmiXgmi:
    """Runs amd-smi's XGMI metric command, remembering which spelling this release takes."""

    def __init__(self, *, which: Callable[[str], str | None] = shutil.which) -> None:
        self.which = which
        self._args = XGMI_ARGS

    def __call__(self, timeout_s: float) -> str:
        path = self.which("amd-smi")
        if path is None:
            raise XgmiUnavailable("amd-smi: not found on PATH")
        failures = []
        for args in self._args:
            shown = " ".join(("amd-smi", *args))
            try:
                done = subprocess.run([path, *args], capture_output=True, text=True,
                                      encoding="utf-8", errors="replace", timeout=timeout_s,
                                      check=False)
            except subprocess.TimeoutExpired as error:
                raise XgmiUnavailable(f"`{shown}` timed out after {timeout_s:g}s") from error
            except OSError as error:
                raise XgmiUnavailable(f"`{shown}` could not be run: {error}") from error
            if done.returncode == 0:
                self._args = (args,)  # this release's spelling; skip the other from now on
                return done.stdout
            lines = (done.stderr or done.stdout or "").strip().splitlines()
            failures.append(f"`{shown}` exited with {done.returncode}: "
                            f"{lines[-1][:200] if lines else 'no output'}")
        raise XgmiUnavailable("; ".join(failures))


class GpuSource:
    """Reads this node's GPUs with whichever tool works, remembering which."""

    def __init__(self, *, probe: Probe = probe_gpus, sysfs_root: str | os.PathLike[str] = "/",
                 tools: Sequence[str] = TOOLS, timeout_s: float = 5.0, retry_s: float = 300.0,
                 pcie_bw: bool = True, xgmi: XgmiRun | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.probe, self.sysfs_root, self.tools = probe, sysfs_root, tuple(tools)
        self.timeout_s, self.retry_s, self.pcie_bw, self.clock = timeout_s, retry_s, pcie_bw, clock
        self.xgmi: XgmiRun = xgmi or AmdSmiXgmi()
        self.tool: str | None = None
        self.reason: str | None = None
        self.xgmi_reason: str | None = None  # why XGMI throughput is off, while it is
        # The last inventory's GPUs by index; replaced whole, never changed in place.
        self.identities: Mapping[int, GpuIdentity] = {}
        self.probes = 0
        self._retry_at = float("-inf")
        self._xgmi_retry_at = float("-inf")
        self._xgmi_last: tuple[float, XgmiTotals] | None = None
        self._log = get_logger(component="gpu-source")

    def read(self) -> tuple[str | None, list[GpuMetrics]]:
        """(tool, GPUs); (None, []) while no tool works, without trying again before
        ``retry_s`` has passed."""
        if self.tool is None and self.clock() < self._retry_at:
            return None, []
        inventory = self._inventory()
        if inventory is None:
            return None, []
        self.identities = {g.index: GpuIdentity(index=g.index, uuid=g.uuid, serial=g.serial,
                                                pci_bus=g.pci_bus, name=g.name)
                           for g in inventory.gpus}
        if self.tool != "amd-smi":
            self._xgmi_last = None  # totals from another run of the tool would make a false rate
            xgmi: dict[int, tuple[float, float] | None] = {}
            pcie = _pcie_by_bus(self.sysfs_root) if self.pcie_bw else {}
        else:
            with ThreadPoolExecutor(max_workers=1) as pool:  # both block for about a second
                pending = pool.submit(self._xgmi_rates)
                pcie = _pcie_by_bus(self.sysfs_root) if self.pcie_bw else {}
                xgmi = pending.result()
        return self.tool, [to_metrics(g, pcie.get(_bus(g.pci_bus)), xgmi.get(g.index))
                           for g in inventory.gpus]

    def _xgmi_rates(self) -> dict[int, tuple[float, float] | None]:
        """Bytes/s per GPU index since the previous reading; {} while XGMI is off."""
        if self.clock() < self._xgmi_retry_at:
            return {}
        try:
            totals = parse_amd_smi_xgmi_json(self.xgmi(self.timeout_s))
            if not totals:
                raise XgmiUnavailable("amd-smi reports no XGMI link counters on this node")
        except Exception as why:  # unsupported, missing, or a parser bug: never stop the GPUs
            self._xgmi_off(str(why))
            return {}
        now = self.clock()
        previous, self._xgmi_last = self._xgmi_last, (now, totals)
        if self.xgmi_reason is not None:
            self._log.info("xgmi counters found", gpus=len(totals))
            self.xgmi_reason = None
        if previous is None:
            return {}
        return xgmi_rates(previous[1], totals, now - previous[0])

    def _xgmi_off(self, reason: str) -> None:
        if reason != self.xgmi_reason:
            self._log.info("no xgmi throughput", reason=reason, retry_s=self.retry_s)
        self.xgmi_reason, self._xgmi_last = reason, None
        self._xgmi_retry_at = self.clock() + self.retry_s

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


def to_metrics(g: GpuSample, pcie: tuple[float, float] | None = None,
               xgmi: tuple[float, float] | None = None) -> GpuMetrics:
    """One GPU's readings on the telemetry contract; ``pcie``/``xgmi`` are (rx, tx) bytes/s."""
    return GpuMetrics(
        index=g.index, util_pct=g.utilization_pct, vram_used_bytes=g.vram_used_bytes,
        vram_total_bytes=g.vram_total_bytes, temp_c=g.temp_edge_c,
        temp_junction_c=g.temp_junction_c, temp_hbm_c=g.temp_memory_c, power_w=g.power_w,
        power_cap_w=g.power_cap_w, sclk_mhz=g.sclk_mhz, mclk_mhz=g.mclk_mhz,
        ecc_correctable=g.ecc_correctable, ecc_uncorrectable=g.ecc_uncorrectable,
        pcie_rx_bytes_s=pcie[0] if pcie else None, pcie_tx_bytes_s=pcie[1] if pcie else None,
        xgmi_rx_bytes_s=xgmi[0] if xgmi else None, xgmi_tx_bytes_s=xgmi[1] if xgmi else None)


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
        self.identities: Mapping[int, GpuIdentity] = {}  # of the GPUs read last
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
                self.identities = getattr(self.gpus, "identities", {})
            except Exception as exc:  # a parser bug must not stop telemetry
                get_logger(component="gpu-source").warning("gpu read failed", error=repr(exc))
                self._tool, self._latest, self.identities = None, [], {}
            self._reading = None
