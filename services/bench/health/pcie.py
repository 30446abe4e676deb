"""PCIe health of the GPUs and NICs: link trained to its width and speed,
and no new AER errors since the last probe.

A GPU at x8 or a NIC at Gen3 halves its bandwidth silently; AER errors on its
link precede it falling off the bus. Everything is read from
``/sys/bus/pci/devices/<bdf>/``.

Decisions:

- The expected link is the lesser of the device's and its upstream port's
  maximum (a Gen5 NIC in a Gen4 slot is not degraded).
- Width is compared strictly: lanes do not come and go with power saving.
- Speed is compared strictly for NICs; for GPUs only with ``gpu_speed_strict``.
  GPUs retrain to a lower speed when idle (AMD Instinct and NVIDIA both report
  2.5 GT/s at idle), so by default a GPU's lower speed is only named in the
  detail of an ``ok``.
- AER (a separate probe, ``pcie_aer``: an error is an event, reported on the
  first run that sees it, while a downtrained link is a state that must
  persist): the counters are remembered between runs; a failure is growth
  since the last probe, never a total from months ago. Fatal or non-fatal
  growth fails; correctable growth fails above ``max_correctable_per_hour``.
  The GPUs' and NICs' upstream ports are read too, since a link's errors are
  often reported by its partner.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.bench.health.base import Finding, HealthProbe, ProbeContext, read_text

PCI_DEVICES = "sys/bus/pci/devices"
GPU_VENDORS = {"0x1002": "AMD", "0x10de": "NVIDIA"}
# The kernel's AER statistics files, and the names a later kernel gives them.
AER_FILES = {"fatal": ("aer_dev_fatal", "aer/err_fatal"),
             "nonfatal": ("aer_dev_nonfatal", "aer/err_nonfatal"),
             "correctable": ("aer_dev_correctable", "aer/err_cor")}
AER_TOTALS = {"fatal": "TOTAL_ERR_FATAL", "nonfatal": "TOTAL_ERR_NONFATAL",
              "correctable": "TOTAL_ERR_COR"}

_clock = time.time  # seconds; tests replace it


@dataclass(frozen=True)
class Link:
    bdf: str
    kind: str  # "gpu" or "nic"
    speed: float | None  # GT/s; None: Unknown (no link)
    width: int | None
    max_speed: float | None
    max_width: int | None


# ---------------------------------------------------------------------- parsers (pure)


def device_kind(pci_class: str, vendor: str) -> str | None:
    """``gpu`` for an AMD/NVIDIA display (0x03xxxx) or processing-accelerator
    (0x12xxxx) function, ``nic`` for a network controller (0x02xxxx) (pure)."""
    pci_class, vendor = pci_class.strip().lower(), vendor.strip().lower()
    if pci_class.startswith("0x02"):
        return "nic"
    if vendor in GPU_VENDORS and pci_class[:4] in ("0x03", "0x12"):
        return "gpu"
    return None


def parse_link_speed(text: str | None) -> float | None:
    """``16.0 GT/s PCIe`` (kernel 5.7+) or ``8 GT/s`` (older) -> GT/s;
    ``Unknown`` or ``Unknown speed`` -> None (pure)."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def parse_width(text: str | None) -> int | None:
    text = (text or "").strip().lstrip("x")
    return int(text) if text.isdigit() else None


def parse_aer(text: str) -> dict[str, int]:
    """An AER statistics file's ``NAME count`` lines -> {name: count} (pure);
    ValueError on a line that is not one."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, count = line.strip().rpartition(" ")
        if not name or not count.isdigit():
            raise ValueError(f"not an AER counter line: {line.strip()[:60]!r}")
        out[name.strip()] = int(count)
    return out


def link_problems(link: Link, *, upstream: Link | None, gpu_speed_strict: bool
                  ) -> tuple[list[str], list[str]]:
    """(failures, notes) for one link (pure); ``upstream`` caps what the link
    can reach."""
    label = f"{link.kind.upper()} {link.bdf}"
    if not link.width or link.speed is None:
        speed = f"{link.speed:g} GT/s" if link.speed else "Unknown"
        return [f"{label} link down (speed {speed}, width x{link.width or 0})"], []
    want_width = _lesser(link.max_width, upstream.max_width if upstream else None)
    want_speed = _lesser(link.max_speed, upstream.max_speed if upstream else None)
    failures, notes = [], []
    if want_width and link.width < want_width:
        failures.append(f"{label} at x{link.width}, capable of x{want_width}")
    if want_speed and link.speed < want_speed:
        phrase = f"{label} at {link.speed:g} GT/s, capable of {want_speed:g}"
        if link.kind == "nic" or gpu_speed_strict:
            failures.append(phrase)
        else:
            notes.append(phrase + " (idle GPUs retrain lower)")
    return failures, notes


def aer_growth(before: Mapping[str, Mapping[str, int]], now: Mapping[str, Mapping[str, int]]
               ) -> dict[str, dict[str, int]]:
    """Per severity, the counters that grew (pure). A counter that went down
    (the driver reloaded) is a new baseline, not growth."""
    out: dict[str, dict[str, int]] = {}
    for severity, counters in now.items():
        grown = {name: count - before.get(severity, {}).get(name, 0)
                 for name, count in counters.items()
                 if name in before.get(severity, {}) and count > before[severity][name]}
        if grown:
            out[severity] = grown
    return out


def _lesser(a: float | None, b: float | None) -> float | None:
    known = [x for x in (a, b) if x]
    return min(known) if known else None


# ---------------------------------------------------------------------- reading the host



def pci_functions(ctx: ProbeContext) -> list[tuple[str, str, Path]]:
    """(bdf, kind, sysfs directory) of every GPU and NIC function."""
    base = ctx.path(PCI_DEVICES)
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for bdf in names:
        kind = device_kind(read_text(base / bdf / "class") or "",
                           read_text(base / bdf / "vendor") or "")
        if kind:
            out.append((bdf, kind, base / bdf))
    return out


def read_link(bdf: str, kind: str, path: Path) -> Link | None:
    """The device's link, or None when it has no PCIe link attributes (a
    virtual function or a paravirtual device)."""
    max_speed = read_text(path / "max_link_speed")
    if max_speed is None:
        return None
    return Link(bdf, kind, parse_link_speed(read_text(path / "current_link_speed")),
                parse_width(read_text(path / "current_link_width")), parse_link_speed(max_speed),
                parse_width(read_text(path / "max_link_width")))


def upstream_of(path: Path) -> Path | None:
    """The upstream port's directory: the parent in the /sys/devices tree."""
    parent = path.resolve().parent
    return parent if (parent / "max_link_speed").exists() else None


def check_pcie_links(ctx: ProbeContext) -> Finding:
    functions = pci_functions(ctx)
    if not functions:
        return Finding("not_applicable", "no GPU or NIC PCI function")
    strict = bool(ctx.options.get("gpu_speed_strict"))
    failures, notes, checked = [], [], 0
    for bdf, kind, path in functions:
        link = read_link(bdf, kind, path)
        if link is None:
            continue
        power = read_text(path / "power_state")
        if power and power != "D0":  # suspended: its link is down by design
            notes.append(f"{kind.upper()} {bdf} in {power}")
            continue
        checked += 1
        up_path = upstream_of(path)
        upstream = read_link(up_path.name, "port", up_path) if up_path else None
        failed, noted = link_problems(link, upstream=upstream, gpu_speed_strict=strict)
        failures += failed
        notes += noted
    if not checked:
        why = f" ({'; '.join(notes)})" if notes else " (virtual devices)"
        return Finding("not_applicable",
                       f"{len(functions)} GPU/NIC functions, none with a PCIe link to read{why}")
    if failures:
        return Finding("failed", "; ".join(failures + notes))
    noted = f"; {'; '.join(notes)}" if notes else ""
    return Finding("ok", f"{checked} links at full width{noted}")


def read_aer(path: Path) -> dict[str, dict[str, int]] | None:
    """A device's AER counters by severity; None when it has none (no AER
    capability). ValueError on a file that does not parse."""
    out = {}
    for severity, names in AER_FILES.items():
        text = next((t for t in (read_text(path / n) for n in names) if t is not None), None)
        if text is not None:
            out[severity] = parse_aer(text)
    return out or None


def check_pcie_aer(ctx: ProbeContext) -> Finding:
    functions = pci_functions(ctx)
    if not functions:
        return Finding("not_applicable", "no GPU or NIC PCI function")
    targets: dict[str, tuple[str, Path]] = {}
    for bdf, kind, path in functions:
        targets.setdefault(bdf, (f"{kind.upper()} {bdf}", path))
        up = upstream_of(path)
        if up is not None:
            targets.setdefault(up.name, (f"port {up.name} (upstream of {bdf})", up))
    now = _clock()
    seen: dict[str, dict] = ctx.state.setdefault("aer", {})
    limit = float(ctx.options.get("max_correctable_per_hour") or 0)
    failures, unreadable, read = [], [], 0
    for key, (label, path) in sorted(targets.items()):
        try:
            counters = read_aer(path)
        except ValueError as exc:
            unreadable.append(f"{label}: {exc}")
            continue
        if counters is None:
            continue
        read += 1
        before = seen.get(key)
        seen[key] = {"t": now, "counters": counters}
        if before is None:
            continue  # the first sight is the baseline
        grown = aer_growth(before["counters"], counters)
        for severity in ("fatal", "nonfatal"):
            if severity in grown:
                failures.append(f"{label} {severity} AER errors: "
                                f"{_named(grown[severity], severity)}")
        if "correctable" in grown:
            corrected = grown["correctable"]
            added = corrected.get(AER_TOTALS["correctable"], max(corrected.values()))
            hours = max(now - before["t"], 1.0) / 3600
            if added / hours > limit:
                failures.append(f"{label} {added} correctable AER errors in {hours * 60:.0f} min "
                                f"({_named(grown['correctable'], 'correctable')}), over "
                                f"{limit:g}/h")
    if failures:
        return Finding("failed", "; ".join(failures))
    if unreadable and not read:
        return Finding("unknown", "; ".join(unreadable))
    if not read:
        return Finding("not_applicable", "no AER counters on the GPUs, NICs or their ports")
    return Finding("ok", f"no new AER errors on {read} devices"
                   + (f"; unreadable: {'; '.join(unreadable)}" if unreadable else ""))


def _named(grown: Mapping[str, int], severity: str) -> str:
    named = {k: v for k, v in grown.items() if k != AER_TOTALS[severity]}
    return ", ".join(f"{k} +{v}" for k, v in sorted(named.items())) or \
        f"+{grown.get(AER_TOTALS[severity], 0)}"


PROBES: tuple[HealthProbe, ...] = (
    HealthProbe(
        kind="pcie_links", run=check_pcie_links, fault="pcie_link_degraded", severity="critical",
        interval_s=60.0, consecutive=3, action="quarantine",
        summary="every GPU and NIC trained to the width (and, for NICs, the speed) its slot "
                "allows; gpu_speed_strict also fails a GPU's lower speed, which idle GPUs "
                "show by design",
        options={"gpu_speed_strict": False}),
    HealthProbe(
        kind="pcie_aer", run=check_pcie_aer, fault="pcie_aer_errors", severity="critical",
        interval_s=60.0, consecutive=1, action="quarantine",
        summary="no fatal or non-fatal AER error on a GPU, NIC or their upstream port since "
                "the last probe, and correctable ones under max_correctable_per_hour",
        options={"max_correctable_per_hour": 600}),
)
