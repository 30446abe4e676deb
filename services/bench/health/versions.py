"""Driver-version probe: the amdgpu driver, ROCm, the NVIDIA driver and CUDA
this node runs. A node upgraded (or not) apart from its fleet behaves apart:
collectives hang or slow down across mismatched drivers, and a job's image
may need a newer one.

The probe states the versions in its detail and fails when one differs from
the configured ``expected`` versions (only those given are compared). The
standard level states them too (``version_check``), so every judged bench
result carries them to the coordinator, which holds each node against the
majority of its GPU model's fleet (``drift``, services/bench/version_drift.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from libs.events import BenchCheck
from services.bench.health.base import Finding, HealthProbe, ProbeContext, ToolUnavailable

# What this probe reads, as the detail names them.
COMPONENTS = ("amdgpu", "rocm", "nvidia", "cuda")

_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")
_AMDSMI_ROCM = re.compile(r"ROCm version:\s*([0-9][\w.\-]*)")


def parse_proc_nvidia_version(text: str) -> str | None:
    """Pure: the driver version from /proc/driver/nvidia/version."""
    m = _NVRM.search(text)
    return m.group(1) if m else None


def parse_nvidia_xml_versions(text: str) -> dict[str, str]:
    """Pure: driver and CUDA version from ``nvidia-smi -q -x``."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from exc
    out = {}
    for key, tag in (("nvidia", "driver_version"), ("cuda", "cuda_version")):
        value = (root.findtext(tag) or "").strip()
        if value and value != "N/A":
            out[key] = value
    if not out:
        raise ValueError("no driver_version in nvidia-smi output")
    return out


def parse_amd_smi_version(text: str) -> str | None:
    """Pure: the ROCm version from ``amd-smi version`` ("... | ROCm version: 6.4.1 | ...")."""
    m = _AMDSMI_ROCM.search(text)
    return m.group(1) if m else None


def drift(
    node_versions: Mapping[str, str], fleet_versions: Sequence[Mapping[str, str]], *,
    min_share: float = 0.0,
) -> list[str]:
    """Pure: what this node runs that differs from the fleet's majority, one
    phrase per component ("rocm 6.2.0, fleet majority 6.3.1 (7 of 8 nodes)").
    Ties break toward the lowest version string, so the answer is stable.
    ``min_share``: a most common version held by no more than this share of
    the nodes reporting the component is no majority, and nothing drifts
    from it (0.5: only a strict majority counts; half a fleet upgraded is a
    rollout in progress, not one odd node)."""
    out = []
    for key, mine in sorted(node_versions.items()):
        seen = Counter(v[key] for v in fleet_versions if v.get(key))
        if not seen:
            continue
        majority, n = min(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        if n <= min_share * sum(seen.values()):
            continue
        if mine != majority:
            out.append(
                f"{key} {mine}, fleet majority {majority} ({n} of {sum(seen.values())} nodes)"
            )
    return out


def state(found: Mapping[str, str]) -> str:
    """Pure: versions as the probe and the bench result state them
    ("amdgpu 6.10.5, rocm 6.3.1"); ``parse_stated`` reads them back."""
    return ", ".join(f"{k} {v}" for k, v in sorted(found.items()))


def parse_stated(detail: str) -> dict[str, str]:
    """Pure: the versions a ``driver_versions`` detail states; what follows
    "; " (the components it could not read) is not a version. A version may
    hold a space (an in-kernel amdgpu: "kernel 6.8.0-45-generic")."""
    out = {}
    for part in detail.split("; ", 1)[0].split(", "):
        key, _, value = part.strip().partition(" ")
        if key in COMPONENTS and value.strip():
            out[key] = value.strip()
    return out


def read_versions(ctx: ProbeContext) -> tuple[dict[str, str], list[str]]:
    """The versions found, and why any could not be read."""
    found: dict[str, str] = {}
    missing: list[str] = []
    if ctx.path("sys/module/amdgpu").exists():
        # A DKMS (ROCm) amdgpu has a version; the in-kernel one goes with the kernel.
        found["amdgpu"] = (
            ctx.read("sys/module/amdgpu/version")
            or f"kernel {ctx.read('proc/sys/kernel/osrelease')}"
        )
        rocm = ctx.read("opt/rocm/.info/version")
        if not rocm:
            try:
                rocm = parse_amd_smi_version(ctx.output(["amd-smi", "version"]))
            except ToolUnavailable as exc:
                missing.append(f"rocm ({exc})")
        if rocm:
            found["rocm"] = rocm
    proc = ctx.read("proc/driver/nvidia/version")
    if proc is not None:
        nvidia = parse_proc_nvidia_version(proc)
        if nvidia:
            found["nvidia"] = nvidia
        try:
            found.update(
                {
                    k: v
                    for k, v in parse_nvidia_xml_versions(
                        ctx.output(["nvidia-smi", "-q", "-x"])
                    ).items()
                    if k not in found
                }
            )
        except (ToolUnavailable, ValueError) as exc:
            missing.append(f"cuda ({exc})")
    return found, missing


def probe(ctx: ProbeContext) -> Finding:
    options: Mapping[str, Any] = {**PROBE.options, **ctx.options}
    found, missing = read_versions(ctx)
    if not found and not missing:
        return Finding(
            "not_applicable", "no GPU driver loaded (no amdgpu module, no /proc/driver/nvidia)"
        )
    stated = state(found) or "none read"
    unread = f"; not read: {', '.join(missing)}" if missing else ""
    expected = {k: str(v) for k, v in (options.get("expected") or {}).items() if v}
    wrong = [
        f"{k} {found[k]} (expected {v})"
        for k, v in sorted(expected.items())
        if k in found and found[k] != v
    ]
    if wrong:
        return Finding("failed", f"version drift: {', '.join(wrong)}; node runs {stated}{unread}")
    if not found:
        return Finding("unknown", f"no version read{unread}")
    return Finding("ok", f"{stated}{unread}")


def version_check(ctx: ProbeContext) -> BenchCheck:
    """The versions this node runs, as a bench run's check: "ok" stating
    them, "skipped" with the reason when none can be read (no GPU driver, or
    its tools missing). Never "failed": the fleet, not the node, says whether
    they are the wrong ones."""
    found, missing = read_versions(ctx)
    unread = f"; not read: {', '.join(missing)}" if missing else ""
    if found:
        return BenchCheck(name=PROBE.kind, status="ok", detail=state(found) + unread)
    why = f"no version read{unread}" if missing else \
        "no GPU driver loaded (no amdgpu module, no /proc/driver/nvidia)"
    return BenchCheck(name=PROBE.kind, status="skipped", detail=why)


PROBE = HealthProbe(
    kind="driver_versions",
    run=probe,
    fault="driver_drift",
    severity="warning",
    interval_s=3600.0,
    consecutive=1,
    action="report",
    summary=(
        "amdgpu driver, ROCm, NVIDIA driver and CUDA versions, failed when one differs from "
        "options expected={amdgpu, rocm, nvidia, cuda} (empty: compare nothing)"
    ),
    options={"expected": {}},
)
PROBES: tuple[HealthProbe, ...] = (PROBE,)
