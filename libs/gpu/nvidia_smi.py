"""Parse ``nvidia-smi --query-gpu ... --format=csv`` and ``nvidia-smi -q -x``.

The bench agent runs the CSV query (cheap, one line per GPU) on CUDA nodes; the
XML dump is the fallback when a field is missing from the query set or a driver
rejects a field name. The CSV comes in three flavours that real scripts use:
``noheader,nounits`` (the agent's own, columns known from the query), with a
header whose cells carry units (``memory.used [MiB]``), and with units inside
the values (``575 MiB``). Unsupported readings print as ``[N/A]`` or, on older
drivers, ``[Not Supported]``.

Pure: text in, models out.
"""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from libs.gpu.model import GpuInventory, GpuSample, ToolOutputError, build_sample
from libs.gpu.units import integer, is_missing, number, pcie_gen_to_gts, text, to_bytes

TOOL = "nvidia-smi"

# The query the bench agent runs (``--format=csv,noheader,nounits``).
QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "pcie.link.gen.current",
    "pcie.link.width.current",
)

# nvidia-smi field (and its documented aliases) -> GpuSample attribute. Where two
# fields feed one attribute the first one present in the row wins.
_FIELD_MAP: dict[str, str] = {
    "index": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "serial": "serial",
    "gpu_serial": "serial",
    "pci.bus_id": "pci_bus",
    "gpu_bus_id": "pci_bus",
    "name": "name",
    "gpu_name": "name",
    "utilization.gpu": "utilization_pct",
    "memory.used": "vram_used_bytes",
    "memory.total": "vram_total_bytes",
    "temperature.gpu": "temp_edge_c",
    "temperature.memory": "temp_memory_c",
    "power.draw": "power_w",
    "power.draw.average": "power_w",
    "power.draw.instant": "power_w",
    "power.limit": "power_cap_w",
    "enforced.power.limit": "power_cap_w",
    "clocks.sm": "sclk_mhz",
    "clocks.current.sm": "sclk_mhz",
    "clocks.gr": "sclk_mhz",
    "clocks.current.graphics": "sclk_mhz",
    "clocks.mem": "mclk_mhz",
    "clocks.current.memory": "mclk_mhz",
    "ecc.errors.corrected.volatile.total": "ecc_correctable",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrectable",
    "pcie.link.gen.current": "pcie_link_speed_gts",
    "pcie.link.gen.gpucurrent": "pcie_link_speed_gts",
    "pcie.link.width.current": "pcie_link_width",
}
_TEXT_ATTRS = {"uuid", "serial", "pci_bus", "name"}
_BYTE_ATTRS = {"vram_used_bytes", "vram_total_bytes"}
_INT_ATTRS = {"index", "ecc_correctable", "ecc_uncorrectable", "pcie_link_width"}
_HEADER_CELL = re.compile(r"^([a-z_][a-z0-9_.]*)(?:\s*\[([^\]]*)\])?$", re.IGNORECASE)
_VALUE_UNIT = re.compile(r"\s([KMG]i?B)\s*$", re.IGNORECASE)


def parse_nvidia_smi_csv(raw: str, fields: Sequence[str] | None = None) -> GpuInventory:
    """Parse ``--query-gpu`` CSV output.

    ``fields`` names the queried columns for ``noheader`` output and defaults to
    ``QUERY_FIELDS``. When the first line is a header it is used instead. Memory
    is MiB unless the header or the value says otherwise; GPUs without an
    ``index`` column are numbered by row.
    """
    lines = [line for line in (raw or "").splitlines() if line.strip()]
    if not lines:
        raise ToolOutputError(TOOL, "no output")
    try:
        rows = list(csv.reader(lines, skipinitialspace=True))
    except csv.Error as error:
        raise ToolOutputError(TOOL, f"output is not CSV ({error})") from error
    columns, units = _header(rows[0])
    if columns is not None:
        rows = rows[1:]
    else:
        columns = [f.strip() for f in (fields or QUERY_FIELDS)]
        units = [None] * len(columns)
    if not rows:
        raise ToolOutputError(TOOL, "header but no GPU rows")

    samples: list[GpuSample] = []
    driver_version: str | None = None
    for row_number, row in enumerate(rows):
        if len(row) != len(columns):
            shown = ", ".join(row)[:160]
            raise ToolOutputError(
                TOOL,
                f"row {row_number + 1} has {len(row)} values, expected {len(columns)} "
                f"({', '.join(columns)}): {shown!r}",
            )
        cells = [cell.strip() for cell in row]
        values = dict(zip(columns, cells, strict=True))
        driver_version = driver_version or text(values.get("driver_version"))
        sample = _csv_sample(columns, units, cells, row_number)
        if any(seen.index == sample.index for seen in samples):
            raise ToolOutputError(TOOL, f"GPU index {sample.index} appears twice")
        samples.append(sample)
    return GpuInventory(tool=TOOL, driver_version=driver_version, gpus=tuple(samples))


def parse_nvidia_smi_xml(raw: str) -> GpuInventory:
    """Parse ``nvidia-smi -q -x``; GPUs are indexed in document order (nvidia-smi's order)."""
    if not (raw or "").strip():
        raise ToolOutputError(TOOL, "no output")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as error:
        raise ToolOutputError(TOOL, f"output is not XML ({error})") from error
    if root.tag != "nvidia_smi_log":
        raise ToolOutputError(TOOL, f"XML root is <{root.tag}>, expected <nvidia_smi_log>")
    gpus = tuple(_xml_sample(index, gpu) for index, gpu in enumerate(root.findall("gpu")))
    return GpuInventory(tool=TOOL, driver_version=text(root.findtext("driver_version")), gpus=gpus)


def _header(first_row: list[str]) -> tuple[list[str] | None, list[str | None]]:
    """Field names and units if ``first_row`` is a CSV header, else (None, [])."""
    names: list[str] = []
    units: list[str | None] = []
    for cell in first_row:
        match = _HEADER_CELL.match(cell.strip())
        if match is None:
            return None, []
        names.append(match.group(1).lower())
        units.append(match.group(2))
    if not any(name in _FIELD_MAP or name == "driver_version" for name in names):
        return None, []
    return names, units


def _csv_sample(
    columns: list[str], units: list[str | None], cells: list[str], row_number: int
) -> GpuSample:
    found: dict[str, Any] = {"index": row_number}
    seen: set[str] = set()
    for column, unit, cell in zip(columns, units, cells, strict=True):
        attr = _FIELD_MAP.get(column)
        if attr is None or attr in seen:
            continue
        value = _csv_value(attr, column, unit, cell)
        if value is not None:
            found[attr] = value
            seen.add(attr)
    return build_sample(TOOL, **found)


def _csv_value(attr: str, column: str, unit: str | None, cell: str) -> object:
    if attr in _TEXT_ATTRS:
        return text(cell)
    if attr in _INT_ATTRS:
        return integer(cell, tool=TOOL, field=column)
    if attr == "pcie_link_speed_gts":
        return pcie_gen_to_gts(integer(cell, tool=TOOL, field=column))
    if attr in _BYTE_ATTRS:
        if is_missing(cell):
            return None
        in_value = _VALUE_UNIT.search(cell)
        return to_bytes(
            number(cell, tool=TOOL, field=column),
            in_value.group(1) if in_value else (unit or "MiB"),
            tool=TOOL,
            field=column,
        )
    return number(cell, tool=TOOL, field=column)


def _xml_number(gpu: ET.Element, *paths: str) -> float | None:
    for path in paths:
        value = number(gpu.findtext(path), tool=TOOL, field=path)
        if value is not None:
            return value
    return None


def _xml_ecc(gpu: ET.Element) -> tuple[int | None, int | None]:
    """Volatile ECC totals: old schema single_bit/double_bit totals, new sram_*/dram_* sums."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None, None
    if volatile.find("single_bit") is not None:
        corrected = integer(volatile.findtext("single_bit/total"), tool=TOOL, field="single_bit")
        uncorrected = integer(volatile.findtext("double_bit/total"), tool=TOOL, field="double_bit")
        return corrected, uncorrected
    sums: dict[str, int | None] = {"_correctable": None, "_uncorrectable": None}
    for child in volatile:
        for suffix in sums:
            if child.tag.endswith(suffix):
                count = integer(child.text, tool=TOOL, field=f"ecc_errors/volatile/{child.tag}")
                if count is not None:
                    sums[suffix] = (sums[suffix] or 0) + count
    return sums["_correctable"], sums["_uncorrectable"]


def _xml_sample(index: int, gpu: ET.Element) -> GpuSample:
    memory_total = _xml_number(gpu, "fb_memory_usage/total")
    memory_used = _xml_number(gpu, "fb_memory_usage/used")
    gen = _xml_number(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")
    width = _xml_number(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width")
    corrected, uncorrected = _xml_ecc(gpu)
    return build_sample(
        TOOL,
        index=index,
        uuid=text(gpu.findtext("uuid")),
        serial=text(gpu.findtext("serial")),
        pci_bus=text(gpu.findtext("pci/pci_bus_id")) or text(gpu.get("id")),
        name=text(gpu.findtext("product_name")),
        utilization_pct=_xml_number(gpu, "utilization/gpu_util"),
        vram_used_bytes=to_bytes(memory_used, "MiB", tool=TOOL, field="fb_memory_usage/used"),
        vram_total_bytes=to_bytes(memory_total, "MiB", tool=TOOL, field="fb_memory_usage/total"),
        temp_edge_c=_xml_number(gpu, "temperature/gpu_temp"),
        temp_memory_c=_xml_number(gpu, "temperature/memory_temp"),
        power_w=_xml_number(
            gpu,
            "gpu_power_readings/power_draw",
            "gpu_power_readings/instant_power_draw",
            "power_readings/power_draw",
        ),
        power_cap_w=_xml_number(
            gpu,
            "gpu_power_readings/current_power_limit",
            "gpu_power_readings/enforced_power_limit",
            "power_readings/enforced_power_limit",
            "power_readings/power_limit",
        ),
        sclk_mhz=_xml_number(gpu, "clocks/sm_clock", "clocks/graphics_clock"),
        mclk_mhz=_xml_number(gpu, "clocks/mem_clock"),
        ecc_correctable=corrected,
        ecc_uncorrectable=uncorrected,
        pcie_link_speed_gts=pcie_gen_to_gts(None if gen is None else int(gen)),
        pcie_link_width=None if width is None else int(width),
    )
