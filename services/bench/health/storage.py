"""Storage health: the configured paths are mounted and writable, and the
local NVMe drives are not failing.

A job whose checkpoint or dataset mount is gone (or hung, for NFS and other
network file systems) fails late and expensively, so ``mounts`` takes the
node out of service. Its write runs in a worker thread with a timeout: a hung
mount blocks that thread in the kernel, never the probe, which reports it
failed within the timeout and, while that write stays stuck, on every later
run without starting another.

``nvme_health`` reads ``nvme smart-log <controller> -o json`` (nvme-cli) for
every controller in /sys/class/nvme. A worn or failing local drive (the
checkpoint cache, the container image store) is reported, not quarantined.
The media-error counter is remembered between runs: growth fails, a count
from months ago does not.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.bench.health.base import Finding, HealthProbe, ProbeContext, ToolUnavailable

NVME_CLASS = "sys/class/nvme"
# critical_warning bits, NVMe base specification (SMART / Health log, byte 0)
WARNING_BITS = {0: "spare below threshold", 1: "temperature", 2: "reliability degraded",
                3: "read-only", 4: "volatile backup failed", 5: "PMR read-only"}


@dataclass(frozen=True)
class Mount:
    device: str
    point: str
    fstype: str
    options: tuple[str, ...]


@dataclass(frozen=True)
class SmartLog:
    critical_warning: int
    avail_spare: int
    spare_thresh: int
    percent_used: int
    media_errors: int


# ---------------------------------------------------------------------- parsers (pure)


def _unescape(field: str) -> str:
    """/proc/mounts writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """/proc/mounts lines -> mounts (pure); lines with too few fields are skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            out.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2],
                             tuple(fields[3].split(","))))
    return out


def _number(value: Any) -> int:
    """nvme-cli writes 128-bit counters as numbers or, in some versions, as
    strings with thousands separators ("2,752,848"); text output adds units."""
    if isinstance(value, bool):
        raise ValueError(f"not a number: {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, dict):  # -H: {"value": 0, "available_spare": 0, ...}
        return _number(value.get("value"))
    match = re.match(r"\s*(0x[0-9a-fA-F]+|[\d,.]+)", str(value))
    if not match:
        raise ValueError(f"not a number: {value!r}")
    token = match.group(1)
    return int(token, 16) if token.startswith("0x") else int(float(token.replace(",", "")))


_KEYS = {  # field -> the names nvme-cli has used for it (JSON first, then text)
    "critical_warning": ("critical_warning",),
    "avail_spare": ("avail_spare", "available_spare"),
    "spare_thresh": ("spare_thresh", "available_spare_threshold"),
    "percent_used": ("percent_used", "percentage_used"),
    "media_errors": ("media_errors",),
}


def parse_smart_log(text: str) -> SmartLog:
    """``nvme smart-log -o json`` (or, from an nvme-cli without JSON, its
    ``key : value`` text) -> the health fields (pure); ValueError when a field
    is missing or the output is neither."""
    fields: dict[str, Any]
    try:
        loaded = json.loads(text)
    except ValueError:
        fields = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip():
                fields[key.strip()] = value.strip()
    else:
        if not isinstance(loaded, dict):
            raise ValueError("smart-log JSON is not an object")
        fields = loaded
    values = {}
    for name, keys in _KEYS.items():
        key = next((k for k in keys if k in fields), None)
        if key is None:
            raise ValueError(f"smart-log has no {name}")
        values[name] = _number(fields[key])
    return SmartLog(**values)


def smart_problems(log: SmartLog, *, max_percent_used: float, media_errors_before: int | None
                   ) -> list[str]:
    """What is wrong with one controller's log (pure)."""
    problems = []
    if log.critical_warning:
        bits = [name for bit, name in WARNING_BITS.items() if log.critical_warning >> bit & 1]
        problems.append(f"critical_warning 0x{log.critical_warning:02x} ({', '.join(bits) or '?'})")
    if log.avail_spare < log.spare_thresh:
        problems.append(f"available spare {log.avail_spare}% below its threshold "
                        f"{log.spare_thresh}%")
    if log.percent_used > max_percent_used:
        problems.append(f"{log.percent_used}% of rated endurance used (over {max_percent_used:g}%)")
    if media_errors_before is not None and log.media_errors > media_errors_before:
        problems.append(f"media errors {media_errors_before} -> {log.media_errors}")
    return problems


# ---------------------------------------------------------------------- mounts


def _write_probe(directory: Path) -> None:
    """Create, sync and remove a small file in ``directory``."""
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".primus-health-") as handle:
        handle.write(b"primus node-health write probe\n")
        handle.flush()
        os.fsync(handle.fileno())


def write_within(directory: Path, timeout_s: float, hung: dict[str, threading.Thread]
                 ) -> str | None:
    """Why ``directory`` is not writable within ``timeout_s`` (None: it is).
    A write still stuck from an earlier run is not repeated."""
    key = str(directory)
    stuck = hung.get(key)
    if stuck is not None and stuck.is_alive():
        return "a write from an earlier probe is still hung"
    outcome: dict[str, str] = {}

    def work() -> None:
        try:
            _write_probe(directory)
            outcome["done"] = ""
        except OSError as exc:
            outcome["error"] = exc.strerror or str(exc)

    worker = threading.Thread(target=work, name=f"health-write {key}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        hung[key] = worker
        return f"write did not finish within {timeout_s:g} s (hung mount?)"
    hung.pop(key, None)
    return f"not writable: {outcome['error']}" if "error" in outcome else None


def check_mounts(ctx: ProbeContext) -> Finding:
    paths = [str(p).rstrip("/") or "/" for p in ctx.options.get("paths") or ()]
    if not paths:
        return Finding("not_applicable", "no required paths configured (option paths)")
    try:
        mounts = {m.point: m for m in parse_mounts(ctx.path("proc/mounts").read_text())}
    except OSError as exc:
        return Finding("unknown", f"/proc/mounts unreadable: {exc.strerror or exc}")
    timeout_s = min(float(ctx.options.get("write_timeout_s") or 10.0), ctx.timeout_s)
    hung = ctx.state.setdefault("hung_writes", {})
    problems, fine = [], []
    for path in paths:
        mount = mounts.get(path)
        if mount is None:
            problems.append(f"{path} not mounted")
            continue
        if "ro" in mount.options:
            problems.append(f"{path} mounted read-only ({mount.fstype} {mount.device})")
            continue
        why = write_within(ctx.path(path.lstrip("/")), timeout_s, hung)
        if why:
            problems.append(f"{path} ({mount.fstype}): {why}")
        else:
            fine.append(f"{path} ({mount.fstype})")
    if problems:
        return Finding("failed", "; ".join(problems))
    return Finding("ok", "mounted and writable: " + ", ".join(fine))


# ---------------------------------------------------------------------- NVMe


def nvme_controllers(ctx: ProbeContext) -> list[str]:
    try:
        names = os.listdir(ctx.path(NVME_CLASS))
    except OSError:
        return []
    return sorted((n for n in names if re.fullmatch(r"nvme\d+", n)), key=lambda n: int(n[4:]))


def check_nvme_health(ctx: ProbeContext) -> Finding:
    controllers = nvme_controllers(ctx)
    if not controllers:
        return Finding("not_applicable", "no NVMe controller (/sys/class/nvme)")
    limit = float(ctx.options.get("max_percent_used") or 90)
    before: dict[str, int] = ctx.state.setdefault("media_errors", {})
    problems, unknown, fine = [], [], []
    for name in controllers:
        try:
            result = ctx.run(["nvme", "smart-log", f"/dev/{name}", "-o", "json"], ctx.timeout_s)
        except ToolUnavailable as exc:
            return Finding("unknown", str(exc))
        if result.returncode != 0:
            first = (result.stderr or result.stdout).strip().splitlines()[:1]
            unknown.append(f"{name}: nvme exited {result.returncode}"
                           + (f" ({first[0][:100]})" if first else ""))
            continue
        try:
            log = parse_smart_log(result.stdout)
        except ValueError as exc:
            unknown.append(f"{name}: unparseable smart-log ({exc})")
            continue
        found = smart_problems(log, max_percent_used=limit, media_errors_before=before.get(name))
        before[name] = log.media_errors
        if found:
            problems.append(f"{name}: {', '.join(found)}")
        else:
            fine.append(f"{name} {log.percent_used}% used")
    if problems:
        return Finding("failed", "; ".join(problems + unknown))
    if unknown:
        return Finding("unknown", "; ".join(unknown))
    return Finding("ok", ", ".join(fine))


PROBES: tuple[HealthProbe, ...] = (
    HealthProbe(
        kind="mounts", run=check_mounts, fault="mount_unavailable", severity="critical",
        interval_s=60.0, consecutive=2, action="quarantine",
        summary="each of paths is a mount point in /proc/mounts, read-write, and takes a "
                "small write within write_timeout_s (a hung network mount fails, never "
                "hangs the probe); not applicable until paths are configured",
        options={"paths": [], "write_timeout_s": 10.0}),
    HealthProbe(
        kind="nvme_health", run=check_nvme_health, fault="nvme_degraded", severity="warning",
        interval_s=300.0, consecutive=1, action="report",
        summary="nvme smart-log of every NVMe controller: no critical warning, spare above "
                "its threshold, no new media errors, wear under max_percent_used",
        options={"max_percent_used": 90}),
)
