"""Parse ``amd-smi`` JSON (``metric``, ``static`` and ``list``) into GpuInventory.

amd-smi is the supported AMD tool from ROCm 6 on and the one the bench agent
prefers. Its JSON changed shape across releases: up to ROCm 6.3 the document is
a bare list of per-GPU objects; later releases wrap it as ``{"gpu_data": [...]}``.
Most readings are "value-wrapped" (``{"value": 36, "unit": "C"}``) but some are
bare numbers, and anything unsupported is the string "N/A". ``metric`` carries
live readings, ``static`` carries names, limits and sizes; the same parser reads
both and ``GpuInventory.merged_with`` combines them.

Pure: text in, models out. Running the tool lives in ``libs.gpu.runner``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from libs.gpu.model import GpuInventory, GpuSample, ToolOutputError, build_sample
from libs.gpu.units import integer, is_missing, load_json, number, text, to_bytes

TOOL = "amd-smi"

_VERSION = re.compile(r"AMDSMI Tool:\s*([^\s|]+)")


def parse_amd_smi_json(raw: str) -> GpuInventory:
    """Parse the JSON printed by ``amd-smi metric|static|list --json``.

    Raises ToolOutputError when the text is not JSON, is not a list of GPU
    objects, or a GPU object lacks its ``gpu`` index or has a non-numeric reading.
    """
    document = load_json(raw, tool=TOOL)
    samples: dict[int, GpuSample] = {}
    driver_version: str | None = None
    for position, entry in enumerate(_gpu_entries(document)):
        if not isinstance(entry, Mapping):
            raise ToolOutputError(TOOL, f"GPU entry {position} is {type(entry).__name__}")
        sample = _sample(entry, position)
        if sample.index in samples:
            raise ToolOutputError(TOOL, f"GPU index {sample.index} appears twice")
        samples[sample.index] = sample
        driver_version = driver_version or text(_at(entry, "driver", "version"))
    return GpuInventory(
        tool=TOOL,
        driver_version=driver_version,
        gpus=tuple(samples[i] for i in sorted(samples)),
    )


def parse_amd_smi_version(raw: str) -> str | None:
    """The tool version from ``amd-smi version`` ("AMDSMI Tool: 24.6.3+9578815 | ..."), if any."""
    match = _VERSION.search(raw or "")
    return match.group(1) if match else None


def _gpu_entries(document: object) -> list[object]:
    if isinstance(document, Mapping):
        if "gpu_data" in document:
            document = document["gpu_data"]
        elif "gpu" in document:
            return [document]
    if not isinstance(document, list):
        raise ToolOutputError(
            TOOL, f"expected a list of GPUs or {{'gpu_data': [...]}}, got {type(document).__name__}"
        )
    return document


def _sample(entry: Mapping[str, object], position: int) -> GpuSample:
    if "gpu" not in entry:
        raise ToolOutputError(TOOL, f"GPU entry {position} has no 'gpu' index")
    index = integer(entry["gpu"], tool=TOOL, field="gpu")
    if index is None or index < 0:
        raise ToolOutputError(TOOL, f"GPU entry {position} has invalid index {entry['gpu']!r}")
    return build_sample(
        TOOL,
        index=index,
        uuid=text(entry.get("uuid")) or text(_at(entry, "asic", "uuid")),
        serial=text(_at(entry, "asic", "asic_serial"))
        or text(_at(entry, "board", "product_serial")),
        pci_bus=text(_at(entry, "bus", "bdf")) or text(entry.get("bdf")),
        name=text(_at(entry, "asic", "market_name")),
        utilization_pct=_reading(entry, "usage", "gfx_activity"),
        vram_used_bytes=_memory(entry, "mem_usage", "used_vram"),
        vram_total_bytes=_memory(entry, "mem_usage", "total_vram")
        or _memory(entry, "vram", "size"),
        temp_edge_c=_reading(entry, "temperature", "edge"),
        temp_junction_c=_first_reading(
            entry, ("temperature", "hotspot"), ("temperature", "junction")
        ),
        temp_memory_c=_first_reading(entry, ("temperature", "mem"), ("temperature", "vram")),
        power_w=_first_reading(
            entry,
            ("power", "socket_power"),
            ("power", "current_socket_power"),
            ("power", "average_socket_power"),
        ),
        power_cap_w=_first_reading(
            entry,
            ("limit", "socket_power"),
            ("limit", "power_cap"),
            ("limit", "ppt0", "socket_power_limit"),
        ),
        sclk_mhz=_clock(entry, "gfx_0", "gfx", "sys"),
        mclk_mhz=_clock(entry, "mem_0", "mem"),
        ecc_correctable=_count(entry, ("ecc", "total_correctable_count"), ("ecc", "correctable")),
        ecc_uncorrectable=_count(
            entry, ("ecc", "total_uncorrectable_count"), ("ecc", "uncorrectable")
        ),
        pcie_link_speed_gts=_pcie_speed(entry),
        pcie_link_width=_count(entry, ("pcie", "width"), ("pcie", "current_width")),
        xgmi_errors=_xgmi(entry.get("xgmi_err")),
    )


def _at(node: object, *path: str) -> object:
    """Walk nested mappings; None as soon as a step is missing or not a mapping."""
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _unwrap(node: object) -> tuple[object, str | None]:
    """``{"value": v, "unit": u}`` -> (v, u); anything else -> (node, None)."""
    if isinstance(node, Mapping) and "value" in node:
        unit = node.get("unit")
        return node["value"], unit if isinstance(unit, str) else None
    return node, None


def _reading(entry: Mapping[str, object], *path: str) -> float | None:
    value, unit = _unwrap(_at(entry, *path))
    field = ".".join(path)
    if isinstance(value, Mapping | list):
        raise ToolOutputError(TOOL, f"field {field!r} is a {type(value).__name__}, not a reading")
    result = number(value, tool=TOOL, field=field)
    if result is not None and unit is not None and unit.lower() == "mw":
        return result / 1000.0
    return result


def _first_reading(entry: Mapping[str, object], *paths: tuple[str, ...]) -> float | None:
    for path in paths:
        result = _reading(entry, *path)
        if result is not None:
            return result
    return None


def _count(entry: Mapping[str, object], *paths: tuple[str, ...]) -> int | None:
    result = _first_reading(entry, *paths)
    return None if result is None else int(result)


def _memory(entry: Mapping[str, object], *path: str) -> int | None:
    value, unit = _unwrap(_at(entry, *path))
    field = ".".join(path)
    # amd-smi labels VRAM "MB" but divides bytes by 2**20, so MB here means MiB.
    return to_bytes(number(value, tool=TOOL, field=field), unit or "MB", tool=TOOL, field=field)


def _clock(entry: Mapping[str, object], *names: str) -> float | None:
    """Current clock from ``metric`` ({"clk": ...}) or ``static`` ({"current level": n, ...})."""
    for name in names:
        node = _at(entry, "clock", name)
        if not isinstance(node, Mapping):
            continue
        if "clk" in node:
            result = _reading(node, "clk")
        elif "current level" in node:
            result = _static_level(node, f"clock.{name}")
        else:
            continue
        if result is not None:
            return result
    return None


def _static_level(node: Mapping[str, object], field: str) -> float | None:
    level = integer(node.get("current level"), tool=TOOL, field=f"{field}.current level")
    levels = node.get("frequency_levels")
    if level is None or not isinstance(levels, Mapping):
        return None
    return number(levels.get(f"Level {level}"), tool=TOOL, field=f"{field}.frequency_levels")


def _pcie_speed(entry: Mapping[str, object]) -> float | None:
    for key in ("speed", "current_speed"):
        value, unit = _unwrap(_at(entry, "pcie", key))
        result = number(value, tool=TOOL, field=f"pcie.{key}")
        if result is not None:
            # Older releases report MT/s; GT/s is the unit everyone compares in.
            return result / 1000.0 if unit and unit.lower() == "mt/s" else result
    return None


def _xgmi(value: object) -> int | None:
    """amd-smi reports XGMI health as a status string; map it onto a small count."""
    value, _ = _unwrap(value)
    if is_missing(value):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        lowered = value.lower()
        if re.fullmatch(r"\s*\d+\s*", lowered):
            return int(lowered)
        if "no error" in lowered or "no_error" in lowered:
            return 0
        if "multiple" in lowered:
            return 2
        if "error" in lowered:
            return 1
    raise ToolOutputError(TOOL, f"field 'xgmi_err' has unexpected value {value!r}")
