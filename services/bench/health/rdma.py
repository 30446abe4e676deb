"""RDMA health: InfiniBand/RoCE ports up and at their rate, a RoCE v2 GID for
NCCL/RCCL on every RoCE port, and the expected count of NICs and RDMA devices.

A dead or downtrained HCA port turns a job's all-reduce into a crawl (or a
hang) while every GPU looks healthy, so these are critical probes that take
the node out of service. Everything is read from sysfs
(``/sys/class/infiniband``, ``/sys/class/net``); ``ibstat`` is only asked when
sysfs lacks a port's field.

Decisions:

- A port's expected rate is, unless ``min_rate_gbps`` is set, the highest rate
  among the node's active ports of the same link layer *and* HCA type: a node
  commonly has 400 Gb/s ConnectX-7 rails beside 100 Gb/s ConnectX-6 front-end
  ports, and the latter are not degraded rails.
- Every port is checked, ``Disabled`` ones included (a rail NIC whose port was
  disabled is exactly the fault); unused ports are excluded with
  ``ignore_devices`` (a regular expression on the device name).
- ``nic_count`` is not inferred: a missing device is precisely what the node
  cannot see, so the expected counts come from configuration (the node type's
  bench config); with neither set the probe is not applicable.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from services.bench.health.base import (
    Finding,
    HealthProbe,
    ProbeContext,
    ToolUnavailable,
    read_text,
)

IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state: str | None = None  # ACTIVE, DOWN, INIT, ARMED
    phys_state: str | None = None  # LinkUp, Polling, Disabled, ...
    rate_gbps: float | None = None
    link_layer: str | None = None  # InfiniBand, Ethernet
    hca_type: str | None = None  # MT4129 (ConnectX-7), ...

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def complete(self) -> bool:
        return None not in (self.state, self.phys_state, self.rate_gbps, self.link_layer)


@dataclass(frozen=True)
class Gid:
    index: int
    address: str
    type: str | None  # "RoCE v2", "IB/RoCE v1"; None when unreadable
    ndev: str | None


# ---------------------------------------------------------------------- parsers (pure)


def parse_sysfs_state(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``, ``5: LinkUp`` -> ``LinkUp`` (pure)."""
    _, _, name = text.strip().partition(":")
    return (name or text).strip()


def parse_rate(text: str) -> float | None:
    """``400 Gb/sec (4X NDR)`` (sysfs) or ``400`` (ibstat) -> 400.0 (pure)."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def parse_ibstat(text: str) -> list[Port]:
    """Every CA port in ``ibstat`` output (pure). Lines it does not know
    (``ibpanic: ...`` after a partial listing) are skipped; ValueError when
    there is no CA at all."""
    ports: list[Port] = []
    device, hca_type, current = None, None, None
    for raw in text.splitlines():
        line = raw.strip()
        if match := re.fullmatch(r"CA '([^']+)'", line):
            if current:
                ports.append(current)
            device, hca_type, current = match.group(1), None, None
        elif device is None:
            continue
        elif line.startswith("CA type:"):
            hca_type = line.partition(":")[2].strip() or None
        elif match := re.fullmatch(r"Port (\d+):", line):
            if current:
                ports.append(current)
            current = Port(device, int(match.group(1)), hca_type=hca_type)
        elif current is not None and ":" in line:
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "State":
                current = replace(current, state=value.upper())
            elif key == "Physical state":
                current = replace(current, phys_state=value)
            elif key == "Rate":
                current = replace(current, rate_gbps=parse_rate(value))
            elif key == "Link layer":
                current = replace(current, link_layer=value)
    if current:
        ports.append(current)
    if device is None:
        raise ValueError("no CA in the ibstat output")
    return ports


def port_problems(ports: Iterable[Port], *, min_rate_gbps: float | None) -> list[str]:
    """What is wrong with these ports, one phrase each (pure): not ACTIVE /
    LinkUp, or slower than ``min_rate_gbps`` (when set) or than the fastest
    active peer of the same link layer and HCA type."""
    ports = list(ports)
    problems = [f"{p.name} {p.state} ({p.phys_state})" for p in ports
                if p.state != "ACTIVE" or (p.phys_state or "").lower() != "linkup"]
    active = [p for p in ports if p.state == "ACTIVE" and p.rate_gbps is not None]
    best: dict[tuple[str | None, str | None], float] = {}
    for p in active:
        key = (p.link_layer, p.hca_type)
        best[key] = max(best.get(key, 0.0), p.rate_gbps or 0.0)
    for p in active:
        rate = p.rate_gbps or 0.0
        if min_rate_gbps is not None:
            if rate < min_rate_gbps:
                problems.append(f"{p.name} at {rate:g} Gb/s, below {min_rate_gbps:g}")
        elif rate < best[(p.link_layer, p.hca_type)]:
            peers = " ".join(x for x in (p.link_layer, p.hca_type) if x)
            problems.append(f"{p.name} at {rate:g} Gb/s, its {peers} peers at "
                            f"{best[(p.link_layer, p.hca_type)]:g}")
    return problems


def usable_roce_gid(gids: Iterable[Gid]) -> Gid | None:
    """The first RoCE v2 GID whose address is IPv4-mapped or global IPv6 (what
    NCCL/RCCL pick by default), or None (pure)."""
    for gid in sorted(gids, key=lambda g: g.index):
        if "v2" not in (gid.type or "").lower():
            continue
        try:
            address = ipaddress.IPv6Address(gid.address.strip())
        except ValueError:
            continue
        if address.ipv4_mapped is not None:
            if not address.ipv4_mapped.is_unspecified:
                return gid
        elif not (address.is_link_local or address.is_loopback or address.is_unspecified
                  or address.is_multicast):
            return gid
    return None


def describe_gid(gid: Gid) -> str:
    address = ipaddress.IPv6Address(gid.address.strip())
    shown = str(address.ipv4_mapped or address)
    return f"GID {gid.index} {gid.type} {shown}" + (f" ({gid.ndev})" if gid.ndev else "")


# ---------------------------------------------------------------------- reading the host



def _entries(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir(), key=lambda p: (len(p.name), p.name))
    except OSError:
        return []


def _ignored(name: str, pattern: str | None) -> bool:
    return bool(pattern) and re.fullmatch(pattern, name) is not None  # type: ignore[arg-type]


def sysfs_ports(ctx: ProbeContext) -> list[Port]:
    """Ports as sysfs shows them; fields it lacks are None."""
    out = []
    for dev in _entries(ctx.path(IB_CLASS)):
        hca_type = read_text(dev / "hca_type") or None
        for port_dir in _entries(dev / "ports"):
            if not port_dir.name.isdigit():
                continue
            state, phys = read_text(port_dir / "state"), read_text(port_dir / "phys_state")
            rate = read_text(port_dir / "rate")
            out.append(Port(
                dev.name, int(port_dir.name),
                state=parse_sysfs_state(state).upper() if state else None,
                phys_state=parse_sysfs_state(phys) if phys else None,
                rate_gbps=parse_rate(rate) if rate else None,
                link_layer=read_text(port_dir / "link_layer") or None, hca_type=hca_type))
    return out


def _with_ibstat(ctx: ProbeContext, ports: list[Port], devices: list[str]
                 ) -> tuple[list[Port], str]:
    """Fill what sysfs lacks from ``ibstat``; also the reason it could not."""
    try:
        result = ctx.run(["ibstat"], ctx.timeout_s)
        listed = parse_ibstat(result.stdout)
    except ToolUnavailable as exc:
        return ports, str(exc)
    except ValueError as exc:
        return ports, f"ibstat: {exc}"
    by_name = {p.name: p for p in listed}
    if not ports:  # sysfs lists devices but no ports: ibstat's view of those devices
        return [p for p in listed if p.device in devices], ""
    filled = []
    for p in ports:
        other = by_name.get(p.name)
        if other is not None:
            p = replace(p, state=p.state or other.state,
                        phys_state=p.phys_state or other.phys_state,
                        rate_gbps=p.rate_gbps if p.rate_gbps is not None else other.rate_gbps,
                        link_layer=p.link_layer or other.link_layer,
                        hca_type=p.hca_type or other.hca_type)
        filled.append(p)
    return filled, ""


def node_ports(ctx: ProbeContext) -> tuple[list[Port], str] | None:
    """The node's ports (sysfs, completed by ibstat) and why some stay
    incomplete; None without /sys/class/infiniband or any device in it."""
    devices = [d.name for d in _entries(ctx.path(IB_CLASS))]
    if not devices:
        return None
    pattern = ctx.options.get("ignore_devices")
    devices = [d for d in devices if not _ignored(d, pattern)]
    ports = [p for p in sysfs_ports(ctx) if p.device in devices]
    why = ""
    if not ports or not all(p.complete for p in ports):
        ports, why = _with_ibstat(ctx, ports, devices)
    return ports, why


# ---------------------------------------------------------------------- probes


def check_rdma_ports(ctx: ProbeContext) -> Finding:
    found = node_ports(ctx)
    if found is None:
        return Finding("not_applicable", "no InfiniBand/RoCE device (/sys/class/infiniband)")
    ports, why = found
    if not ports:
        return Finding("unknown",
                       f"RDMA devices without readable ports; {why or 'ibstat lists none'}")
    complete = [p for p in ports if p.complete]
    incomplete = [p.name for p in ports if not p.complete]
    problems = port_problems(complete, min_rate_gbps=ctx.options.get("min_rate_gbps"))
    if problems:
        return Finding("failed", "; ".join(problems))
    if incomplete:
        return Finding("unknown", f"state or rate unreadable for {', '.join(incomplete)}"
                       + (f" ({why})" if why else ""))
    rates = sorted({f"{p.rate_gbps:g}" for p in complete}, key=float)
    return Finding("ok", f"{len(complete)} ports ACTIVE/LinkUp at {'/'.join(rates)} Gb/s")


def port_gids(port_dir: Path) -> list[Gid]:
    """A port's populated GID table entries (all-zero slots left out; their
    type file is unreadable, EINVAL)."""
    out = []
    for entry in _entries(port_dir / "gids"):
        address = read_text(entry)
        if not entry.name.isdigit() or not address:
            continue
        try:
            if ipaddress.IPv6Address(address).is_unspecified:
                continue
        except ValueError:
            continue
        out.append(Gid(int(entry.name), address,
                       read_text(port_dir / "gid_attrs" / "types" / entry.name) or None,
                       read_text(port_dir / "gid_attrs" / "ndevs" / entry.name) or None))
    return out


def check_rdma_gids(ctx: ProbeContext) -> Finding:
    found = node_ports(ctx)
    ports = found[0] if found else []
    roce = [p for p in ports if (p.link_layer or "").lower() == "ethernet"]
    if not roce:
        return Finding("not_applicable", "no RoCE (Ethernet link layer) port")
    # A port that is down is rdma_ports' finding; its GIDs are not judged here.
    up = [p for p in roce if p.state in ("ACTIVE", None)]
    missing, good = [], []
    for p in up:
        gids = port_gids(ctx.path(IB_CLASS, p.device, "ports", str(p.port)))
        gid = usable_roce_gid(gids)
        if gid is None:
            kinds = sorted({g.type or "?" for g in gids})
            missing.append(f"{p.name} ({len(gids)} GIDs: {', '.join(kinds) or 'none'})")
        else:
            good.append(f"{p.name} {describe_gid(gid)}")
    if missing:
        return Finding("failed", "no RoCE v2 GID with an IPv4 or global IPv6 address on "
                       + "; ".join(missing))
    if not up:
        return Finding("not_applicable", "no active RoCE port")
    return Finding("ok", "; ".join(good))


def physical_nics(ctx: ProbeContext) -> list[str]:
    """Network interfaces backed by a device (lo, bridges, veth, bonds, ifb
    have no ``device`` link)."""
    return [n.name for n in _entries(ctx.path(NET_CLASS)) if (n / "device").exists()]


def count_problems(kind: str, names: list[str], expected: int | None) -> str | None:
    """``None`` when ``names`` reach ``expected`` (pure)."""
    if expected is None or len(names) >= expected:
        return None
    return f"{len(names)} {kind} of {expected} expected ({', '.join(names) or 'none'})"


def check_nic_count(ctx: ProbeContext) -> Finding:
    want_rdma = ctx.options.get("expected_rdma_devices")
    want_nics = ctx.options.get("expected_nics")
    if want_rdma is None and want_nics is None:
        return Finding("not_applicable", "no expected_rdma_devices or expected_nics configured")
    rdma = [d.name for d in _entries(ctx.path(IB_CLASS))
            if re.fullmatch(ctx.options.get("rdma_name_regex") or ".*", d.name)]
    nics = [n for n in physical_nics(ctx)
            if re.fullmatch(ctx.options.get("nic_name_regex") or ".*", n)]
    problems = [p for p in (count_problems("RDMA devices", rdma, want_rdma),
                            count_problems("NICs", nics, want_nics)) if p]
    if problems:
        return Finding("failed", "; ".join(problems))
    seen = []
    if want_rdma is not None:
        seen.append(f"{len(rdma)} RDMA devices (expected {want_rdma})")
    if want_nics is not None:
        seen.append(f"{len(nics)} NICs (expected {want_nics})")
    return Finding("ok", ", ".join(seen))


PROBES: tuple[HealthProbe, ...] = (
    HealthProbe(
        kind="rdma_ports", run=check_rdma_ports, fault="rdma_port_down", severity="critical",
        interval_s=30.0, consecutive=2, action="quarantine",
        summary="every InfiniBand/RoCE port ACTIVE/LinkUp and at its rate (min_rate_gbps, "
                "default the fastest active port of the same link layer and HCA type); "
                "ignore_devices: a regex of device names not checked",
        options={"min_rate_gbps": None, "ignore_devices": None}),
    HealthProbe(
        kind="rdma_gids", run=check_rdma_gids, fault="rdma_gid_missing", severity="critical",
        interval_s=60.0, consecutive=2, action="quarantine",
        summary="every active RoCE port has a RoCE v2 GID with an IPv4-mapped or global IPv6 "
                "address (NCCL/RCCL's default GID); ignore_devices as rdma_ports",
        options={"ignore_devices": None}),
    HealthProbe(
        kind="nic_count", run=check_nic_count, fault="nic_missing", severity="critical",
        interval_s=300.0, consecutive=2, action="quarantine",
        summary="at least expected_rdma_devices RDMA devices (named by rdma_name_regex) and "
                "expected_nics physical NICs (named by nic_name_regex); not applicable "
                "until a count is configured",
        options={"expected_rdma_devices": None, "expected_nics": None,
                 "rdma_name_regex": None, "nic_name_regex": None}),
)
