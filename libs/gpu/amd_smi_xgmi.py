"""Parse ``amd-smi xgmi --metric --json`` into per-GPU XGMI byte counters, and rate them.

XGMI (Infinity Fabric) is the GPU-to-GPU link on Instinct parts; its traffic is
what a collective-heavy job lives on, and no sysfs file exposes it the way
``pcie_bw`` exposes PCIe. amd-smi reports, per GPU and per peer link, the data
read and written since the driver loaded, in KB (``{"value": 2, "unit": "KB"}``;
``"N/A"`` for the GPU's link to itself and for links it does not have). The
Lens sampler wants one received and one sent figure per GPU, so a GPU's links
are summed; two such totals some seconds apart make a rate (``xgmi_rates``).

The same document says what the links allow (``parse_amd_smi_xgmi_links``):
per GPU ``bit_rate`` (Gb/s per lane) and ``max_bandwidth`` (Gb/s per link,
per direction: the rate times the link's width; an MI300X shows 32 and 512,
16 lanes), and one ``links`` entry per peer, "N/A" where the GPU has no link
to that peer. The bench derives the expected intra-node bus bandwidth from it
(services/bench/link_rates.py).

The document is a bare list of GPUs up to ROCm 6.x; later releases wrap it as
``{"xgmi_metric": [...]}`` (sometimes one list deeper). Both are read.

Pure: text in, numbers out. Running amd-smi lives in the sampler's shell.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from libs.gpu.model import ToolOutputError
from libs.gpu.units import integer, is_missing, load_json, number, to_bytes

TOOL = "amd-smi"

# GPU index -> (bytes read over XGMI, bytes written over XGMI), summed over its links.
XgmiTotals = dict[int, tuple[int, int]]

# units.to_bytes stops at GB; the CLI's "readable units" change went as far as PB.
_LARGE_UNITS = {"tb": 1024**4, "tib": 1024**4, "pb": 1024**5, "pib": 1024**5}
_TEXT_AMOUNT = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_amd_smi_xgmi_json(raw: str) -> XgmiTotals:
    """Per GPU, the bytes read and written over all its XGMI links since the driver loaded.

    A GPU whose links all say "N/A" (no XGMI, or a consumer card) is left out,
    so an empty result means this node reports no XGMI traffic at all.
    Raises ToolOutputError when the text is not JSON, is not a list of GPU
    objects, or a GPU or link is not shaped as amd-smi prints it.
    """
    totals: XgmiTotals = {}
    for position, entry in enumerate(_gpu_entries(load_json(raw, tool=TOOL))):
        if not isinstance(entry, Mapping):
            raise ToolOutputError(TOOL, f"xgmi GPU entry {position} is {type(entry).__name__}")
        if "gpu" not in entry:
            raise ToolOutputError(TOOL, f"xgmi GPU entry {position} has no 'gpu' index")
        index = integer(entry["gpu"], tool=TOOL, field="gpu")
        if index is None or index < 0:
            raise ToolOutputError(
                TOOL, f"xgmi GPU entry {position} has invalid index {entry['gpu']!r}"
            )
        if index in totals:
            raise ToolOutputError(TOOL, f"xgmi GPU index {index} appears twice")
        summed = _sum_links(entry, index)
        if summed is not None:
            totals[index] = summed
    return totals


@dataclass(frozen=True)
class XgmiLinks:
    """One GPU's XGMI links: what each allows and which peers it reaches."""

    index: int
    bdf: str | None
    bit_rate_gbps: float | None  # per lane
    link_gbps: float | None  # max_bandwidth: per link and direction
    peers: tuple[int, ...]  # GPUs this one has a link to (counters not "N/A")


def parse_amd_smi_xgmi_links(raw: str) -> dict[int, XgmiLinks]:
    """Per GPU, its XGMI link rate and the peers it has a link to.

    A GPU whose ``link_metrics`` are missing or "N/A" (no XGMI) is left out.
    Raises ToolOutputError as ``parse_amd_smi_xgmi_json`` does, and on a rate
    whose unit is not a bit or byte rate.
    """
    out: dict[int, XgmiLinks] = {}
    for position, entry in enumerate(_gpu_entries(load_json(raw, tool=TOOL))):
        if not isinstance(entry, Mapping) or "gpu" not in entry:
            raise ToolOutputError(TOOL, f"xgmi GPU entry {position} is not a GPU object")
        index = integer(entry["gpu"], tool=TOOL, field="gpu")
        if index is None or index < 0 or index in out:
            raise ToolOutputError(TOOL, f"xgmi GPU entry {position} has index {entry['gpu']!r}")
        metrics = entry.get("link_metrics")
        if not isinstance(metrics, Mapping):
            continue  # "N/A" or absent: no XGMI on this GPU
        bdf = entry.get("bdf")
        out[index] = XgmiLinks(
            index=index, bdf=bdf if isinstance(bdf, str) else None,
            bit_rate_gbps=_gbps(metrics.get("bit_rate"), f"GPU {index} bit_rate"),
            link_gbps=_gbps(metrics.get("max_bandwidth"), f"GPU {index} max_bandwidth"),
            peers=_peers(metrics, index))
    return out


# Gb/s per unit; amd-smi prints "Gb/s", the library's unit for link rates.
_RATE_UNITS = {"gb/s": 1.0, "gbps": 1.0, "mb/s": 1e-3, "mbps": 1e-3, "tb/s": 1e3}


def _gbps(node: object, field: str) -> float | None:
    """Gb/s from ``{"value": 512, "unit": "Gb/s"}`` or a bare number (Gb/s); None for N/A."""
    if node is None or is_missing(node):
        return None
    value, unit = (node.get("value"), node.get("unit", "Gb/s")) if isinstance(node, Mapping) \
        else (node, "Gb/s")
    amount = number(value, tool=TOOL, field=f"xgmi {field}")
    if amount is None:
        return None
    if not isinstance(unit, str):
        raise ToolOutputError(TOOL, f"xgmi {field} has unit {unit!r}")
    if unit.strip() == "GB/s":  # bytes: the case tells them from bits
        return amount * 8
    scale = _RATE_UNITS.get(unit.strip().lower())
    if scale is None:
        raise ToolOutputError(TOOL, f"xgmi {field} has unit {unit!r}, expected Gb/s")
    return amount * scale


def _peers(metrics: Mapping[str, object], index: int) -> tuple[int, ...]:
    """The other GPUs whose link entry carries counters (a link this GPU has)."""
    links = metrics.get("links")
    if not isinstance(links, list):
        return ()
    peers = []
    for position, link in enumerate(links):
        if not isinstance(link, Mapping):
            raise ToolOutputError(TOOL, f"xgmi GPU {index}: link {position} is not an object")
        peer = integer(link.get("gpu"), tool=TOOL, field=f"GPU {index} link {position} gpu")
        if peer is None or peer == index:
            continue
        if not (is_missing(link.get("read")) and is_missing(link.get("write"))):
            peers.append(peer)
    return tuple(sorted(peers))


def xgmi_rates(
    before: Mapping[int, tuple[int, int]], after: Mapping[int, tuple[int, int]], elapsed_s: float
) -> dict[int, tuple[float, float] | None]:
    """Bytes/s (received, sent) per GPU in ``after``, from two readings ``elapsed_s`` apart.

    None for a GPU that has no earlier reading, and for one whose counters went
    down (driver reload, GPU reset, a link that dropped out of the sum): a
    negative rate is not traffic.
    """
    rates: dict[int, tuple[float, float] | None] = {}
    for index, (read_now, written_now) in after.items():
        earlier = before.get(index)
        if earlier is None or elapsed_s <= 0:
            rates[index] = None
            continue
        read_then, written_then = earlier
        if read_now < read_then or written_now < written_then:
            rates[index] = None
            continue
        rates[index] = (
            (read_now - read_then) / elapsed_s,
            (written_now - written_then) / elapsed_s,
        )
    return rates


def _gpu_entries(document: object) -> list[object]:
    if isinstance(document, Mapping):
        if "xgmi_metric" in document:
            document = document["xgmi_metric"]
        elif "gpu" in document:  # `amd-smi xgmi -m -g 0 --json` on some releases
            return [document]
    if not isinstance(document, list):
        raise ToolOutputError(
            TOOL,
            "expected a list of GPUs or {'xgmi_metric': [...]} from "
            f"`xgmi --metric --json`, got {type(document).__name__}",
        )
    # The wrapped form holds one list per command run: [[gpu, gpu, ...]].
    entries: list[object] = []
    for item in document:
        entries.extend(item if isinstance(item, list) else [item])
    return entries


def _sum_links(entry: Mapping[str, object], index: int) -> tuple[int, int] | None:
    metrics = entry.get("link_metrics")
    if metrics is None or is_missing(metrics):
        return None
    if not isinstance(metrics, Mapping):
        raise ToolOutputError(
            TOOL,
            f"xgmi GPU {index}: 'link_metrics' is {type(metrics).__name__}, expected an object",
        )
    links = metrics.get("links")
    if links is None or is_missing(links):
        return None
    if not isinstance(links, list):
        raise ToolOutputError(
            TOOL,
            f"xgmi GPU {index}: 'link_metrics.links' is {type(links).__name__}, expected a list",
        )
    read_total = written_total = 0
    seen = False
    for position, link in enumerate(links):
        if not isinstance(link, Mapping):
            raise ToolOutputError(
                TOOL,
                f"xgmi GPU {index}: link {position} is {type(link).__name__}, expected an object",
            )
        where = f"GPU {index} link {position}"
        read = _amount(link.get("read"), f"{where} read")
        written = _amount(link.get("write"), f"{where} write")
        if read is None and written is None:
            continue  # the link to itself, or one this GPU does not have
        seen = True
        read_total += read or 0
        written_total += written or 0
    return (read_total, written_total) if seen else None


def _amount(node: object, field: str) -> int | None:
    """Bytes from ``{"value": v, "unit": "KB"}``, a bare number (KB) or "1259 KB"; None for N/A."""
    if is_missing(node):
        return None
    unit: object = "KB"  # the library's unit for these counters
    if isinstance(node, Mapping):
        if "value" not in node:
            raise ToolOutputError(TOOL, f"xgmi {field} has no 'value'")
        value, unit = node["value"], node.get("unit", "KB")
    elif isinstance(node, str):
        match = _TEXT_AMOUNT.match(node)
        if match is None:
            raise ToolOutputError(TOOL, f"xgmi {field} has unexpected value {node!r}")
        value, unit = match.group(1), match.group(2) or "KB"
    else:
        value = node
    amount = number(value, tool=TOOL, field=f"xgmi {field}")
    if amount is None:
        return None
    if amount < 0:
        raise ToolOutputError(TOOL, f"xgmi {field} is negative ({amount:g})")
    if not isinstance(unit, str):
        raise ToolOutputError(TOOL, f"xgmi {field} has unit {unit!r}, expected text such as 'KB'")
    large = _LARGE_UNITS.get(unit.strip().lower())
    if large is not None:
        return int(amount * large)
    return to_bytes(amount, unit, tool=TOOL, field=f"xgmi {field}")
