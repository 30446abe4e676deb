"""Read the links between this node's GPUs, for the intra-node link check
(``link_rates.intranode_check``). The shell around the pure parsers: XGMI
from ``amd-smi xgmi -m --json`` where the amdgpu driver is loaded, NVLink
from ``nvidia-smi nvlink -s`` where NVIDIA's is, and else each GPU's PCIe
link from ``/sys/bus/pci/devices``. A tool that is missing, fails or prints
something unparseable is a reason, never an error: the check then says
"skipped" with it, as the health probes say "unknown".
"""

from __future__ import annotations

from collections.abc import Callable

from libs.gpu.amd_smi_xgmi import parse_amd_smi_xgmi_links
from libs.gpu.model import ToolOutputError
from libs.gpu.nvidia_smi_nvlink import parse_nvlink_status
from services.bench.health.base import ProbeContext, ToolUnavailable
from services.bench.health.pcie import pci_functions, read_link, upstream_of
from services.bench.link_rates import GpuLinks, from_nvlink, from_pcie, from_xgmi

Reader = Callable[[ProbeContext], list[GpuLinks]]


def xgmi_links(ctx: ProbeContext) -> list[GpuLinks]:
    if not ctx.path("sys/module/amdgpu").exists():
        return []
    return from_xgmi(parse_amd_smi_xgmi_links(ctx.output(["amd-smi", "xgmi", "-m", "--json"])))


def nvlink_links(ctx: ProbeContext) -> list[GpuLinks]:
    if not ctx.path("proc/driver/nvidia").exists():
        return []
    return from_nvlink(parse_nvlink_status(ctx.output(["nvidia-smi", "nvlink", "-s"])))


def pcie_links(ctx: ProbeContext) -> list[GpuLinks]:
    pairs = []
    for bdf, kind, path in pci_functions(ctx):
        link = read_link(bdf, kind, path) if kind == "gpu" else None
        if link is None:
            continue
        up = upstream_of(path)
        pairs.append((link, read_link(up.name, "port", up) if up else None))
    return from_pcie(pairs)


def read_gpu_links(ctx: ProbeContext) -> tuple[list[GpuLinks], str]:
    """The GPUs' links from the first source that has them (a GPU fabric
    before PCIe, which every GPU also has), or none and why."""
    why: list[str] = []
    readers: tuple[tuple[str, Reader], ...] = (
        ("XGMI", xgmi_links), ("NVLink", nvlink_links), ("PCIe", pcie_links))
    for fabric, reader in readers:
        try:
            found = reader(ctx)
        except (ToolUnavailable, ToolOutputError) as exc:
            why.append(f"{fabric}: {exc}")
            continue
        if found:
            return found, ""
    return [], "; ".join(why) or ("no XGMI or NVLink (no amdgpu or nvidia driver) and no GPU "
                                  "PCIe link under /sys/bus/pci/devices")
