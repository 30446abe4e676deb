"""Kernel-log probe: GPU, machine-check and memory errors the kernel logged
since the last run. A GPU that fell off the bus, an uncorrectable HBM error or
a machine check shows up here first, often before any tool notices.

Source: ``dmesg --json`` (util-linux >= 2.35; the kernel ring buffer, needs no
journal mounted into the pod), else ``journalctl -k -o json`` (when dmesg is
not permitted, as in a container without CAP_SYSLOG but with the journal
mounted). The cursor in ``ctx.state`` is the boot id and the last message's
time since boot (dmesg) or the journal cursor; the first run, or the first
after a reboot, looks back ``lookback_s`` seconds of uptime.

Patterns are one table (``PATTERNS``); each says whether it means hardware
(or driver) trouble, which fails the probe, or usually the application (a GPU
page fault, XID 13), which is named in the detail but fails nothing unless
``fail_on_application``. NVIDIA XIDs are classified from NVIDIA's XID
catalogue: https://docs.nvidia.com/deploy/xid-errors/index.html
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.bench.health.base import Finding, HealthProbe, ProbeContext, ToolUnavailable

# XID -> meaning, for XIDs NVIDIA lists as hardware, driver, ECC or bus trouble.
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
# XIDs that NVIDIA attributes to the application in most cases.
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
}


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    hardware: bool  # False: usually the application's fault


PATTERNS: tuple[Pattern, ...] = (
    Pattern("amdgpu ring timeout", re.compile(r"amdgpu.*\bring \S+ timeout"), True),
    Pattern("amdgpu GPU reset", re.compile(r"amdgpu.*GPU reset begin"), True),
    Pattern("amdgpu uncorrectable error", re.compile(r"amdgpu.*uncorrectable", re.I), True),
    Pattern(
        "amdgpu hardware error", re.compile(r"amdgpu.*\[Hardware Error\]: .*events logged"), True
    ),
    Pattern(
        "amdgpu page fault",
        re.compile(r"amdgpu.*\[(gfx|mm)hub\d*\] (no-)?(retry )?page fault"),
        False,
    ),
    Pattern("NVIDIA GPU fallen off the bus", re.compile(r"NVRM: .*fallen off the bus"), True),
    Pattern(
        "machine check", re.compile(r"mce: \[Hardware Error\]: Machine check events logged"), True
    ),
    Pattern("EDAC uncorrectable error", re.compile(r"EDAC .*\b\d+ UE\b"), True),
)
_XID = re.compile(r"NVRM: Xid \((PCI:[^)]*)\): (\d+),")


@dataclass(frozen=True)
class Match:
    name: str
    hardware: bool
    line: str


def classify(lines: Iterable[str]) -> list[Match]:
    """Pure: the error lines among ``lines``, each with what it is."""
    out: list[Match] = []
    for line in lines:
        xid = _XID.search(line)
        if xid:
            number = int(xid.group(2))
            meaning = HARDWARE_XIDS.get(number) or APPLICATION_XIDS.get(number) or "unlisted"
            out.append(Match(f"NVIDIA XID {number} ({meaning})", number in HARDWARE_XIDS, line))
            continue
        for pattern in PATTERNS:
            if pattern.regex.search(line):
                out.append(Match(pattern.name, pattern.hardware, line))
                break
    return out


def parse_dmesg_json(text: str) -> list[tuple[float, str]]:
    """Pure: ``dmesg --json`` as (seconds since boot, message); ValueError if
    it is not that."""
    doc = json.loads(text) if text.strip() else {"dmesg": []}
    entries = doc.get("dmesg") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ValueError("no 'dmesg' list")
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or "msg" not in entry:
            raise ValueError(f"unexpected entry {entry!r:.80}")
        out.append((float(entry.get("time", 0.0)), str(entry["msg"])))
    return out


def parse_journal_json(text: str) -> list[tuple[str, str]]:
    """Pure: ``journalctl -o json`` (one object a line) as (cursor, message).
    A MESSAGE that is not UTF-8 comes as a list of byte values."""
    out = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        entry = json.loads(raw)
        message = entry.get("MESSAGE", "")
        if isinstance(message, list):
            message = bytes(message).decode("utf-8", "replace")
        out.append((str(entry["__CURSOR"]), str(message)))
    return out



def _from_dmesg(ctx: ProbeContext, lookback_s: float) -> list[str]:
    done = ctx.run(["dmesg", "--json"], ctx.timeout_s)
    if done.returncode != 0:
        raise ToolUnavailable(
            f"dmesg: {(done.stderr or done.stdout).strip()[:200] or f'exit {done.returncode}'}"
        )
    entries = parse_dmesg_json(done.stdout)
    boot = (ctx.read("proc/sys/kernel/random/boot_id", strip=False) or "").strip()
    cursor = ctx.state.get("kernel_log")
    if isinstance(cursor, dict) and cursor.get("source") == "dmesg" and cursor.get("boot") == boot:
        since = float(cursor["time"])
        new = [(t, m) for t, m in entries if t > since]
    else:
        uptime = (ctx.read("proc/uptime", strip=False) or "").split()
        since = float(uptime[0]) - lookback_s if uptime else float("-inf")
        new = [(t, m) for t, m in entries if t >= since]
    last = max([t for t, _ in entries], default=since if since != float("-inf") else 0.0)
    ctx.state["kernel_log"] = {"source": "dmesg", "boot": boot, "time": last}
    return [m for _, m in new]


def _from_journal(ctx: ProbeContext, lookback_s: float) -> list[str]:
    cursor = ctx.state.get("kernel_log")
    argv = ["journalctl", "-k", "-o", "json", "--no-pager"]
    if isinstance(cursor, dict) and cursor.get("source") == "journal":
        argv += ["--after-cursor", str(cursor["cursor"])]
    else:
        argv += ["--since", f"-{int(lookback_s)}s"]
    done = ctx.run(argv, ctx.timeout_s)
    if done.returncode != 0 or "No journal files" in done.stderr:
        raise ToolUnavailable(
            f"journalctl: {(done.stderr or done.stdout).strip()[:200] or f'exit {done.returncode}'}"
        )
    entries = parse_journal_json(done.stdout)
    if entries:
        ctx.state["kernel_log"] = {"source": "journal", "cursor": entries[-1][0]}
    return [m for _, m in entries]


def summarize(matches: Sequence[Match], *, fail_on_application: bool) -> Finding:
    """Pure: the finding for the error lines found since the last probe."""
    failing = [m for m in matches if m.hardware or fail_on_application]
    others = [m for m in matches if m not in failing]
    if not failing:
        note = f"; ignored (usually the application): {_counts(others)}" if others else ""
        return Finding("ok", f"no kernel errors since the last probe{note}")
    first = failing[0].line.strip()
    return Finding(
        "failed", f"{len(failing)} kernel error line(s): {_counts(failing)}; first: {first[:300]}"
    )


def _counts(matches: Sequence[Match]) -> str:
    counts: dict[str, int] = {}
    for m in matches:
        counts[m.name] = counts.get(m.name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def probe(ctx: ProbeContext) -> Finding:
    options: Mapping[str, Any] = {**PROBE.options, **ctx.options}
    lookback = float(options["lookback_s"])
    reasons = []
    for source in (_from_dmesg, _from_journal):
        try:
            lines = source(ctx, lookback)
        except ToolUnavailable as exc:
            reasons.append(str(exc))
            continue
        except (ValueError, KeyError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            reasons.append(f"{source.__name__[6:]}: unparseable output ({exc})")
            continue
        return summarize(classify(lines), fail_on_application=bool(options["fail_on_application"]))
    return Finding("unknown", "; ".join(reasons))


PROBE = HealthProbe(
    kind="kernel_log",
    run=probe,
    fault="gpu_xid",
    severity="critical",
    interval_s=60.0,
    consecutive=1,
    action="quarantine",
    summary=(
        "kernel messages since the last probe: amdgpu ring timeouts, resets and uncorrectable "
        "errors, NVIDIA hardware XIDs, machine checks, EDAC UE (options: lookback_s=600 for the "
        "first run, fail_on_application=False)"
    ),
    options={"lookback_s": 600.0, "fail_on_application": False},
)
PROBES: tuple[HealthProbe, ...] = (PROBE,)
