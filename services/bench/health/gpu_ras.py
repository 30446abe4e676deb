"""GPU RAS probe: retired and pending memory pages, row-remap failures and
uncorrectable ECC counts, per GPU. A page pending retirement or a remap that
failed means the GPU needs a reset or a repair before it can be trusted with a
job; uncorrectable counts that keep growing mean the HBM is going.

AMD: ``amd-smi bad-pages --json`` (retired / pending / unreservable pages)
and ``amd-smi metric --ecc --ecc-blocks --json`` (total and per-block
uncorrectable counts). NVIDIA: ``nvidia-smi -q -x`` (retired pages, pending
retirement, remapped rows pending/failure, aggregate uncorrectable ECC).
The vendor is chosen by the loaded driver (/sys/module/amdgpu,
/proc/driver/nvidia); with neither the probe is not applicable.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.bench.health.base import Finding, HealthProbe, ProbeContext, ToolUnavailable


@dataclass
class GpuRas:
    """What one GPU says; None where the tool answered N/A."""

    gpu: str
    retired: int | None = None
    pending: int | None = None
    unreservable: int | None = None
    uncorrectable: int | None = None  # aggregate since the counters were cleared
    remap_pending: bool = False
    remap_failure: bool = False
    blocks: dict[str, int] = field(default_factory=dict)  # AMD per-block uncorrectable


def _gpu_list(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
        doc = doc["gpu_data"]
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list) or not all(isinstance(g, dict) for g in doc):
        raise ValueError("not an amd-smi per-GPU list")
    return doc


def _page_count(value: Any) -> int | None:
    # amd-smi prints "No bad pages found." (none), "N/A" (not supported), one
    # page as an object, several as a list (amdsmi_cli/amdsmi_commands.py).
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict):
        return 1
    if isinstance(value, str) and value.strip().lower().startswith("no bad pages"):
        return 0
    return None


def parse_amd_bad_pages(text: str) -> dict[str, GpuRas]:
    """Pure: ``amd-smi bad-pages --json`` by GPU index."""
    out = {}
    for g in _gpu_list(json.loads(text)):
        gpu = str(g.get("gpu", len(out)))
        out[gpu] = GpuRas(
            gpu,
            retired=_page_count(g.get("retired")),
            pending=_page_count(g.get("pending")),
            unreservable=_page_count(g.get("un_res")),
        )
    return out


def _int(value: Any) -> int | None:
    if isinstance(value, dict):  # newer amd-smi: {"value": n, "unit": ...}
        value = value.get("value")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_amd_ecc(text: str) -> dict[str, GpuRas]:
    """Pure: ``amd-smi metric [--ecc --ecc-blocks] --json`` by GPU index."""
    out = {}
    for g in _gpu_list(json.loads(text)):
        gpu = str(g.get("gpu", len(out)))
        ecc = g.get("ecc")
        ras = GpuRas(
            gpu,
            uncorrectable=_int(ecc.get("total_uncorrectable_count"))
            if isinstance(ecc, dict)
            else None,
        )
        blocks = g.get("ecc_blocks")
        if isinstance(blocks, dict):
            for name, counts in blocks.items():
                n = _int(counts.get("uncorrectable_count")) if isinstance(counts, dict) else None
                if n is not None:
                    ras.blocks[name] = n
        out[gpu] = ras
    return out


def _xml_int(node: ET.Element | None, path: str) -> int | None:
    return _int(node.findtext(path)) if node is not None else None


def parse_nvidia_xml(text: str) -> dict[str, GpuRas]:
    """Pure: ``nvidia-smi -q -x`` by PCI bus id; ValueError if not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root is <{root.tag}>, not <nvidia_smi_log>")
    out = {}
    for g in root.findall("gpu"):
        gpu = g.get("id") or g.findtext("pci/pci_bus_id") or str(len(out))
        pages = g.find("retired_pages")
        sbe = _xml_int(pages, "multiple_single_bit_retirement/retired_count")
        dbe = _xml_int(pages, "double_bit_retirement/retired_count")
        retired = None if sbe is None and dbe is None else (sbe or 0) + (dbe or 0)
        pending_text = (pages.findtext("pending_retirement") or "") if pages is not None else ""
        agg = g.find("ecc_errors/aggregate")
        unc = None
        if agg is not None:
            counts = [_int(c.text) for c in agg if "uncorrectable" in c.tag]
            if any(c is not None for c in counts):
                unc = sum(c for c in counts if c is not None)
        remap = g.find("remapped_rows")
        out[gpu] = GpuRas(
            gpu,
            retired=retired,
            pending={"Yes": 1, "No": 0}.get(pending_text.strip()),
            uncorrectable=unc,
            remap_pending=remap is not None
            and (remap.findtext("remapped_row_pending") or "") == "Yes",
            remap_failure=remap is not None
            and (remap.findtext("remapped_row_failure") or "") == "Yes",
        )
    return out


def judge(
    gpus: Mapping[str, GpuRas], last_uncorrectable: Mapping[str, int], *, max_bad_pages: int
) -> list[str]:
    """Pure: what is wrong, one phrase per GPU problem (empty: healthy)."""
    problems = []
    for gpu, ras in sorted(gpus.items()):
        if ras.pending:
            problems.append(f"GPU {gpu}: {ras.pending} page(s) pending retirement")
        if ras.remap_failure:
            problems.append(f"GPU {gpu}: row remapping failed")
        if ras.remap_pending:
            problems.append(f"GPU {gpu}: row remapping pending (needs a GPU reset)")
        bad = (ras.retired or 0) + (ras.unreservable or 0)
        if bad > max_bad_pages:
            problems.append(f"GPU {gpu}: {bad} bad pages (over {max_bad_pages})")
        before = last_uncorrectable.get(gpu)
        if ras.uncorrectable is not None and before is not None and ras.uncorrectable > before:
            problems.append(
                f"GPU {gpu}: uncorrectable ECC errors grew {before} -> {ras.uncorrectable}"
            )
    return problems



def _amd(ctx: ProbeContext) -> dict[str, GpuRas]:
    gpus = parse_amd_bad_pages(ctx.output(["amd-smi", "bad-pages", "--json"]))
    for gpu, ecc in parse_amd_ecc(
        ctx.output(["amd-smi", "metric", "--ecc", "--ecc-blocks", "--json"])
    ).items():
        ras = gpus.setdefault(gpu, GpuRas(gpu))
        ras.uncorrectable, ras.blocks = ecc.uncorrectable, ecc.blocks
    return gpus


def _nvidia(ctx: ProbeContext) -> dict[str, GpuRas]:
    return parse_nvidia_xml(ctx.output(["nvidia-smi", "-q", "-x"]))


def probe(ctx: ProbeContext) -> Finding:
    options: Mapping[str, Any] = {**PROBE.options, **ctx.options}
    readers = []
    if ctx.path("sys/module/amdgpu").exists():
        readers.append(_amd)
    if ctx.path("proc/driver/nvidia").exists():
        readers.append(_nvidia)
    if not readers:
        return Finding(
            "not_applicable", "no GPU driver loaded (no amdgpu module, no /proc/driver/nvidia)"
        )
    gpus: dict[str, GpuRas] = {}
    try:
        for read in readers:
            gpus.update(read(ctx))
    except ToolUnavailable as exc:
        return Finding("unknown", str(exc))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return Finding("unknown", f"unparseable GPU tool output ({exc})")
    if not gpus:
        return Finding("unknown", "the GPU tool listed no GPU")
    last = ctx.state.get("gpu_ras_uncorrectable", {})
    problems = judge(gpus, last, max_bad_pages=int(options["max_bad_pages"]))
    ctx.state["gpu_ras_uncorrectable"] = {
        g: r.uncorrectable for g, r in gpus.items() if r.uncorrectable is not None
    }
    if problems:
        return Finding("failed", "; ".join(problems))
    retired = sum(r.retired or 0 for r in gpus.values())
    return Finding(
        "ok",
        f"{len(gpus)} GPU(s): no pending retirement or remap failure, {retired} retired page(s)",
    )


PROBE = HealthProbe(
    kind="gpu_ras",
    run=probe,
    fault="gpu_retired_pages",
    severity="critical",
    interval_s=600.0,
    consecutive=1,
    action="quarantine",
    summary=(
        "GPU RAS per GPU (amd-smi bad-pages/metric --ecc, nvidia-smi -q -x): pages pending "
        "retirement, row-remap pending/failure, uncorrectable ECC grown since the last probe, "
        "bad pages over max_bad_pages (option, default 64)"
    ),
    options={"max_bad_pages": 64},
)
PROBES: tuple[HealthProbe, ...] = (PROBE,)
