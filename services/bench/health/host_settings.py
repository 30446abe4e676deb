"""Host-settings probe: kernel and PCIe settings that slow a training job
without breaking the node, so a failure is a warning that is reported.

- NUMA balancing (/proc/sys/kernel/numa_balancing): AMD's MI300X system
  optimization guide says to disable it ("Disable NUMA auto-balancing",
  https://rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html).
- CPU frequency governor per CPU (cpufreq scaling_governor): ``performance``
  expected; not applicable without cpufreq (most VMs and containers).
- IOMMU: when an IOMMU is active (/sys/class/iommu has entries) the kernel
  command line should put it in pass-through (``iommu=pt``), as AMD's Instinct
  tuning guides recommend (same guide, and the MI100/MI200 guides' "IOMMU"
  sections), or turn it off; translated DMA costs GPU and RDMA bandwidth.
- ACS on PCIe bridges (``lspci -vvv`` "ACSCtl:"): SrcValid+ forces peer-to-
  peer traffic up to the root complex (NVIDIA NCCL troubleshooting, "PCI
  Access Control Services"). Every bridge is checked, not only those above a
  GPU; turn the check off where ACS is wanted.

Each sub-check can be switched off (``check_numa_balancing`` and so on).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.bench.health.base import Finding, HealthProbe, ProbeContext, Status, ToolUnavailable


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str



def check_numa_balancing(value: str | None) -> Check:
    """Pure: the numa_balancing sysctl's text (None: absent)."""
    if value is None:
        return Check("numa_balancing", "not_applicable", "no /proc/sys/kernel/numa_balancing")
    if value.strip() == "0":
        return Check("numa_balancing", "ok", "off")
    return Check("numa_balancing", "failed", f"{value.strip()} (should be 0)")


def check_governors(governors: Mapping[str, str], expected: str) -> Check:
    """Pure: scaling_governor per CPU name."""
    if not governors:
        return Check("cpu_governor", "not_applicable", "no cpufreq")
    off = {cpu: g for cpu, g in governors.items() if g != expected}
    if not off:
        return Check("cpu_governor", "ok", f"{expected} on {len(governors)} CPUs")
    kinds = sorted(set(off.values()))
    return Check(
        "cpu_governor",
        "failed",
        f"{'/'.join(kinds)} on {len(off)} of {len(governors)} CPUs (expected {expected})",
    )


def check_iommu(iommu_units: Sequence[str], cmdline: str) -> Check:
    """Pure: the /sys/class/iommu entries and the kernel command line."""
    if not iommu_units:
        return Check("iommu", "not_applicable", "no active IOMMU")
    args = cmdline.split()
    if "iommu=pt" in args or any(
        a in args for a in ("amd_iommu=off", "intel_iommu=off", "iommu=off")
    ):
        return Check("iommu", "ok", "pass-through" if "iommu=pt" in args else "off")
    return Check(
        "iommu", "failed", f"{len(iommu_units)} IOMMU unit(s) translating DMA; add iommu=pt"
    )


_BDF = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s")
_FLAG = re.compile(r"(\w+)([+-])")


def parse_acs(lspci_vvv: str) -> list[tuple[str, dict[str, bool]]]:
    """Pure: (device, ACSCtl flags) per "ACSCtl:" line of ``lspci -vvv``; the
    device is the BDF of the block above ("?" when the output has none)."""
    out = []
    device = "?"
    for line in lspci_vvv.splitlines():
        m = _BDF.match(line)
        if m:
            device = m.group(1)
            continue
        stripped = line.strip()
        if stripped.startswith("ACSCtl:"):
            flags = {name: sign == "+" for name, sign in _FLAG.findall(stripped[len("ACSCtl:") :])}
            out.append((device, flags))
    return out


def check_acs(ports: Sequence[tuple[str, Mapping[str, bool]]], flags: Sequence[str]) -> Check:
    """Pure: bridges with any of ``flags`` on."""
    if not ports:
        return Check("acs", "not_applicable", "no bridge with ACS control")
    on = [(dev, [f for f in flags if bits.get(f)]) for dev, bits in ports]
    on = [(dev, fs) for dev, fs in on if fs]
    if not on:
        return Check("acs", "ok", f"{'/'.join(flags)} off on {len(ports)} bridge(s)")
    named = ", ".join(sorted({dev for dev, _ in on}))
    return Check(
        "acs", "failed", f"{'/'.join(flags)} on at {len(on)} of {len(ports)} bridge(s) ({named})"
    )


def combine(checks: Sequence[Check]) -> Finding:
    """Pure: failed if any sub-check failed, else ok if any is ok, else
    unknown if any could not tell, else not applicable; every sub-check named."""
    detail = "; ".join(f"{c.name}: {c.status.replace('_', ' ')} ({c.detail})" for c in checks)
    statuses = {c.status for c in checks}
    for status in ("failed", "ok", "unknown"):
        if status in statuses:
            return Finding(status, detail)  # type: ignore[arg-type]
    return Finding("not_applicable", detail or "every sub-check switched off")


def _governors(ctx: ProbeContext) -> dict[str, str]:
    cpus = ctx.path("sys/devices/system/cpu")
    out = {}
    for f in sorted(cpus.glob("cpu[0-9]*/cpufreq/scaling_governor")) if cpus.is_dir() else ():
        try:
            out[f.parent.parent.name] = f.read_text(encoding="utf-8").strip()
        except OSError:
            continue
    return out


def _acs(ctx: ProbeContext, flags: Sequence[str]) -> Check:
    try:
        done = ctx.run(["lspci", "-vvv"], ctx.timeout_s)
    except ToolUnavailable as exc:
        return Check("acs", "unknown", str(exc))
    if done.returncode != 0:
        return Check(
            "acs", "unknown", f"lspci: exit {done.returncode}: {done.stderr.strip()[:200]}"
        )
    ports = parse_acs(done.stdout)
    if not ports and "ACSCtl" not in done.stdout and "Access Control Services" in done.stdout:
        # ACS listed but its control not readable: lspci runs unprivileged.
        return Check("acs", "unknown", "lspci shows no ACSCtl (needs root)")
    return check_acs(ports, flags)


def probe(ctx: ProbeContext) -> Finding:
    options: Mapping[str, Any] = {**PROBE.options, **ctx.options}
    checks = []
    if options["check_numa_balancing"]:
        checks.append(check_numa_balancing(ctx.read("proc/sys/kernel/numa_balancing")))
    if options["check_cpu_governor"]:
        checks.append(check_governors(_governors(ctx), str(options["cpu_governor"])))
    if options["check_iommu"]:
        iommu = ctx.path("sys/class/iommu")
        units = sorted(p.name for p in iommu.iterdir()) if iommu.is_dir() else []
        checks.append(check_iommu(units, ctx.read("proc/cmdline") or ""))
    if options["check_acs"]:
        checks.append(_acs(ctx, list(options["acs_flags"])))
    return combine(checks)


PROBE = HealthProbe(
    kind="host_settings",
    run=probe,
    fault="host_setting",
    severity="warning",
    interval_s=3600.0,
    consecutive=1,
    action="report",
    summary=(
        "host settings that slow jobs: NUMA balancing on, CPU governor not cpu_governor "
        "(default performance), IOMMU translating without iommu=pt, ACS acs_flags (default "
        "SrcValid) on PCIe bridges; check_numa_balancing/check_cpu_governor/check_iommu/"
        "check_acs switch each off"
    ),
    options={
        "check_numa_balancing": True,
        "check_cpu_governor": True,
        "cpu_governor": "performance",
        "check_iommu": True,
        "check_acs": True,
        "acs_flags": ("SrcValid",),
    },
)
PROBES: tuple[HealthProbe, ...] = (PROBE,)
