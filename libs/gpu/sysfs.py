"""Read AMD GPU readings straight from the amdgpu driver's sysfs files.

The fallback for nodes where neither amd-smi nor rocm-smi is installed (slim
containers, a broken ROCm install) but the amdgpu kernel driver is loaded: the
same counters the tools read are exposed under ``/sys/class/drm/cardN/device``.
The root path is an argument so tests point it at a fake tree. Files that are
absent, unreadable or unparsable simply leave that reading empty: sysfs
contents vary by kernel and ASIC, and a fallback must not fail a probe.

Units in sysfs: bytes, percent, millidegrees C, microwatts, Hz.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from libs.gpu.model import GpuInventory, GpuSample

TOOL = "sysfs"
AMD_VENDOR_ID = "0x1002"

_CARD_DIR = re.compile(r"^card(\d+)$")
_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_TEMP_LABELS = {"edge": "temp_edge_c", "junction": "temp_junction_c", "mem": "temp_memory_c"}


def read_amdgpu_sysfs(root: str | os.PathLike[str] = "/") -> GpuInventory:
    """All AMD GPUs under ``root``/sys/class/drm, indexed in card order from 0.

    Non-AMD cards (vendor other than 0x1002) and connector entries such as
    ``card0-DP-1`` are skipped. An empty inventory means no amdgpu devices.
    """
    drm = Path(root) / "sys" / "class" / "drm"
    try:
        entries = sorted(
            (int(m.group(1)), drm / name)
            for name in os.listdir(drm)
            if (m := _CARD_DIR.match(name))
        )
    except OSError:
        return GpuInventory(tool=TOOL)
    gpus: list[GpuSample] = []
    for _card_number, card in entries:
        device = card / "device"
        if (_read(device / "vendor") or "").lower() != AMD_VENDOR_ID:
            continue
        gpus.append(_sample(len(gpus), device))
    driver = _read(Path(root) / "sys" / "module" / "amdgpu" / "version")
    return GpuInventory(tool=TOOL, driver_version=driver, gpus=tuple(gpus))


def _sample(index: int, device: Path) -> GpuSample:
    hwmon = _hwmon_dir(device)
    readings: dict[str, float | None] = {}
    power_cap = power = sclk = mclk = None
    if hwmon is not None:
        readings = _temperatures(hwmon)
        power = _scaled(hwmon / "power1_average", 1e6)
        if power is None:
            power = _scaled(hwmon / "power1_input", 1e6)
        power_cap = _scaled(hwmon / "power1_cap", 1e6) or None
        sclk = _scaled(hwmon / "freq1_input", 1e6)
        mclk = _scaled(hwmon / "freq2_input", 1e6)
    correctable, uncorrectable = _ras_totals(device / "ras")
    xgmi = _ras_counts(device / "ras" / "xgmi_wafl_err_count")
    busy = _number(device / "gpu_busy_percent")
    used = _number(device / "mem_info_vram_used")
    total = _number(device / "mem_info_vram_total")
    width = _number(device / "current_link_width")
    return GpuSample(
        index=index,
        uuid=_read(device / "unique_id"),
        serial=_read(device / "serial_number"),
        pci_bus=_bdf(device),
        name=_read(device / "product_name"),
        utilization_pct=busy,
        vram_used_bytes=None if used is None else int(used),
        vram_total_bytes=None if total is None else int(total),
        power_w=power,
        power_cap_w=power_cap,
        sclk_mhz=sclk,
        mclk_mhz=mclk,
        ecc_correctable=correctable,
        ecc_uncorrectable=uncorrectable,
        pcie_link_speed_gts=_number(device / "current_link_speed"),
        pcie_link_width=None if width is None else int(width),
        xgmi_errors=None if xgmi is None else sum(xgmi.values()),
        **readings,
    )


def _read(path: Path) -> str | None:
    try:
        value = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return value or None


def _number(path: Path) -> float | None:
    """The leading non-negative number of a file ("16.0 GT/s PCIe" -> 16.0), or None."""
    raw = _read(path)
    match = re.match(r"^\d+(?:\.\d+)?", raw or "")
    return float(match.group()) if match else None


def _scaled(path: Path, divisor: float) -> float | None:
    """The file's number divided into display units (µW -> W: 1e6, m°C -> °C: 1e3)."""
    value = _number(path)
    return None if value is None else value / divisor


def _hwmon_dir(device: Path) -> Path | None:
    try:
        names = sorted(n for n in os.listdir(device / "hwmon") if n.startswith("hwmon"))
    except OSError:
        return None
    return device / "hwmon" / names[0] if names else None


def _temperatures(hwmon: Path) -> dict[str, float | None]:
    """temp*_input by temp*_label (edge/junction/mem); an unlabelled temp1 is edge."""
    found: dict[str, float | None] = {}
    for sensor in range(1, 10):
        value = _scaled(hwmon / f"temp{sensor}_input", 1e3)
        if value is None:
            continue
        label = (_read(hwmon / f"temp{sensor}_label") or ("edge" if sensor == 1 else "")).lower()
        attr = _TEMP_LABELS.get(label)
        if attr is not None and attr not in found:
            found[attr] = value
    return found


def _ras_counts(path: Path) -> dict[str, int] | None:
    """A RAS counter file: lines "ue: 0" / "ce: 0" (and "de: 0" on newer kernels)."""
    raw = _read(path)
    if raw is None:
        return None
    counts = {
        m.group(1).lower(): int(m.group(2))
        for m in re.finditer(r"^\s*(\w+)\s*:\s*(\d+)\s*$", raw, re.MULTILINE)
    }
    return counts or None


def _ras_totals(ras: Path) -> tuple[int | None, int | None]:
    """Correctable/uncorrectable totals over every RAS block, as amd-smi's totals are."""
    try:
        names = sorted(n for n in os.listdir(ras) if n.endswith("_err_count"))
    except OSError:
        return None, None
    correctable = uncorrectable = None
    for name in names:
        counts = _ras_counts(ras / name)
        if counts is None:
            continue
        if "ce" in counts:
            correctable = (correctable or 0) + counts["ce"]
        if "ue" in counts:
            uncorrectable = (uncorrectable or 0) + counts["ue"]
    return correctable, uncorrectable


def _bdf(device: Path) -> str | None:
    """The PCI address: ``device`` is a symlink to .../0000:83:00.0 on a real system."""
    name = os.path.basename(os.path.realpath(device))
    return name if _BDF.match(name) else None
