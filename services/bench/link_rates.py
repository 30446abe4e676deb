"""What the node's links promise, for judging its collectives (pure).

Within a node (``intranode_check``) every GPU's links to the others are read
from the node: XGMI on AMD Instinct (``amd-smi xgmi -m``), NVLink on NVIDIA
(``nvidia-smi nvlink -s``), the GPU's PCIe link where there is no GPU fabric
(services/bench/node_links.py reads them). The expected figure is what the
best-connected GPU's links carry in one direction; a figure far below it
fails, and the reason names any GPU whose links run below its peers (an XGMI
or NVLink link down, a PCIe link trained at x8).

Between nodes a rail-optimized GPU node gives each GPU rank one NIC, so an
inter-node all-reduce's or all-to-all's bus bandwidth approaches one port's
rate (nccl-tests' busbw is defined so that it does). The expected figure is
the rate of the node's fastest active RDMA port class (``/sys/class/
infiniband``, read by ``health.rdma``) in GB/s; a figure far below it fails,
and the reason names any port running below its peers (a NIC at half rate),
which is usually why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from libs.events import BenchCheck, Figure
from libs.gpu.amd_smi_xgmi import XgmiLinks
from libs.gpu.nvidia_smi_nvlink import NvlinkGpu
from services.bench.collectives import OPS, size_label
from services.bench.health.pcie import Link, link_problems
from services.bench.health.rdma import Port, port_problems


def expected_internode_gbps(ports: Sequence[Port]) -> float | None:
    """GB/s per rank the node's NICs allow: the fastest active port's rate
    (Gb/s / 8); None without an active RDMA port (then nothing is expected)."""
    rates = [p.rate_gbps for p in ports if p.state == "ACTIVE" and p.rate_gbps]
    return max(rates) / 8 if rates else None


def internode_check(figures: Sequence[Figure], ports: Sequence[Port], *,
                    sizes: Sequence[int], min_fraction: float) -> BenchCheck:
    """The largest message's inter-node bus bandwidth against the NIC rate."""
    expected = expected_internode_gbps(ports)
    if expected is None:
        return BenchCheck(name="internode_link_rate", status="skipped",
                          detail="no active RDMA port: no rate to expect")
    label = size_label(max(sizes))
    measured = {f.name: f.value for f in figures
                if f.name.startswith("internode_") and f"_{label}_" in f.name}
    if not measured:
        return BenchCheck(name="internode_link_rate", status="skipped",
                          detail=f"no inter-node figure at {label}")
    worst_name, worst = min(measured.items(), key=lambda kv: kv[1])
    floor = min_fraction * expected
    slow_ports = [p for p in port_problems(ports, min_rate_gbps=None) if " at " in p]
    detail = (f"{worst_name} {worst:.4g} GB/s against {expected:.4g} GB/s a port allows "
              f"({worst / expected:.0%})")
    if worst >= floor:
        return BenchCheck(name="internode_link_rate", status="ok", detail=detail)
    why = f"; {'; '.join(slow_ports)}" if slow_ports else ""
    return BenchCheck(name="internode_link_rate", status="failed",
                      detail=f"{detail}, below {min_fraction:.0%}{why}")


# --------------------------------------------------------------------------- within a node

Fabric = Literal["XGMI", "NVLink", "PCIe"]
# A GPU this much below the best-connected one is "below its peers": link
# rates are printed rounded (26.562), so equal links may differ in the last digit.
PEER_TOLERANCE = 0.01


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's links to the other GPUs: GB/s per active link, per direction."""

    gpu: str  # how the detail names it: "GPU 5 (0000:af:00.0)"
    fabric: Fabric
    rates: tuple[float, ...]
    problems: tuple[str, ...] = ()  # what the reading itself shows wrong (a PCIe link down)
    notes: tuple[str, ...] = ()  # worth saying, not a fault (an idle GPU's PCIe speed)

    @property
    def gbps(self) -> float:
        """GB/s this GPU can send at once: its active links summed."""
        return sum(self.rates)


def pcie_gbps(speed_gts: float, width: int) -> float:
    """GB/s one direction of a PCIe link carries: GT/s per lane x lanes x the
    line code's payload share (8b/10b up to Gen2, 128b/130b Gen3 to Gen5,
    Gen6's FLIT 242/256), in bytes. Gen4 x16: 31.5; Gen5 x16: 63.0."""
    code = 0.8 if speed_gts <= 5.0 else 242 / 256 if speed_gts >= 64.0 else 128 / 130
    return speed_gts * width * code / 8


def from_xgmi(gpus: Mapping[int, XgmiLinks]) -> list[GpuLinks]:
    """Each GPU's XGMI links: one per peer it reaches, at ``max_bandwidth``
    (Gb/s per link and direction) / 8. Empty when no GPU has a rated XGMI
    link to a peer (a node without XGMI: its GPUs talk over PCIe)."""
    if not any(g.peers and g.link_gbps for g in gpus.values()):
        return []
    return [GpuLinks(gpu=_label(i, g.bdf), fabric="XGMI",
                     rates=tuple((g.link_gbps or 0.0) / 8 for _ in g.peers))
            for i, g in sorted(gpus.items())]


def from_nvlink(gpus: Mapping[int, NvlinkGpu]) -> list[GpuLinks]:
    """Each GPU's active NVLinks at the rate nvidia-smi states (GB/s per
    direction). Empty when no GPU has an active NVLink (a PCIe-only board)."""
    if not any(g.active for g in gpus.values()):
        return []
    return [GpuLinks(gpu=_label(i, None), fabric="NVLink",
                     rates=tuple(rate for _, rate in sorted(g.active.items())))
            for i, g in sorted(gpus.items())]


def from_pcie(links: Sequence[tuple[Link, Link | None]]) -> list[GpuLinks]:
    """Each GPU's PCIe link (with its upstream port, which caps it) at its
    current width and the speed both ends allow. Width is taken as it is
    (lanes do not come and go with power saving); the current speed is not,
    since idle GPUs retrain to 2.5 GT/s by design (services/bench/health/
    pcie.py): a lower one is named in the notes, never counted against it."""
    out = []
    for link, upstream in links:
        failures, notes = link_problems(link, upstream=upstream, gpu_speed_strict=False)
        caps = [x for x in (link.max_speed, upstream.max_speed if upstream else None) if x]
        up = link.width and link.speed  # a link down carries nothing
        rate = pcie_gbps(min(caps) if caps else link.speed or 0.0, link.width or 0) if up else 0.0
        out.append(GpuLinks(gpu=f"GPU {link.bdf}", fabric="PCIe", rates=(rate,) if rate else (),
                            problems=tuple(failures), notes=tuple(notes)))
    return out


def expected_intranode_gbps(gpus: Sequence[GpuLinks]) -> float | None:
    """GB/s of bus bandwidth per rank the GPUs' links allow for an
    all-reduce, all-gather or all-to-all over every GPU of the node; None
    when no link was read (then nothing is expected).

    Why the best GPU's links summed, in one direction: nccl-tests and
    rccl-tests define busbw so that it is the traffic each rank puts on its
    links, independent of the rank count (all-reduce algbw x 2(n-1)/n: a ring
    step sends and receives 1/n of the buffer 2(n-1) times; all-gather and
    all-to-all x (n-1)/n), and compare it with "the hardware's peak
    bandwidth" (https://github.com/NVIDIA/nccl-tests/blob/master/doc/
    PERFORMANCE.md). Every rank sends and receives at once, so the ceiling is
    one direction of a GPU's links. On a fully connected XGMI mesh of N GPUs
    each GPU has N-1 links; RCCL runs several rings over different
    permutations (and all-to-all sends each peer its share on its own link),
    so all N-1 links carry traffic together: 8 MI300X, 7 x 64 GB/s = 448 GB/s
    (amd-smi: max_bandwidth 512 Gb/s per link). Through NVSwitch all of a
    GPU's NVLinks lead to every peer (H100 SXM: 18 x 26.562 GB/s); a bridged
    H100 PCIe pair has 12 (318.7 GB/s, and a recorded peer copy reached
    256.6 GB/s, 80%: tests/gpu/fixtures/README.md). Without a GPU fabric a
    ring crosses each GPU's PCIe link once each way, so its one-direction
    rate is the ceiling (Gen5 x16: 63 GB/s). Protocol overhead keeps a
    healthy node below the figure, and a sparse topology (a hybrid cube
    mesh) further: it is a ceiling, which ``min_fraction`` of the check
    turns into a floor. The best-connected GPU stands for all of them, as
    the fastest port does between nodes: a GPU with a link down lowers what
    the collective reaches (a ring waits for its slowest member), not what
    the node should reach."""
    best = max((g.gbps for g in gpus), default=0.0)
    return best or None


def links_below_peers(gpus: Sequence[GpuLinks]) -> list[str]:
    """One phrase per GPU whose links carry less than the best-connected
    GPU's (a link down, a lower rate, a narrower PCIe link), then what the
    readings themselves say is wrong (pure)."""
    best = max(gpus, key=lambda g: g.gbps, default=None)
    if best is None:
        return []
    out = []
    for g in gpus:
        if g.gbps < best.gbps * (1 - PEER_TOLERANCE):
            out.append(f"{g.gpu} has {_describe(g)}, its peers {_describe(best)}")
    out += [p for g in gpus for p in g.problems]
    return out


def intranode_check(figures: Sequence[Figure], gpus: Sequence[GpuLinks], *,
                    sizes: Sequence[int], min_fraction: float, unread: str = "") -> BenchCheck:
    """The largest message's intra-node bus bandwidth (the worst of
    all-reduce, all-gather and all-to-all) against what the GPUs' links
    allow (``expected_intranode_gbps``). ``unread``: why no link was read."""
    name = "intranode_link_rate"
    expected = expected_intranode_gbps(gpus)
    if expected is None:
        return BenchCheck(name=name, status="skipped",
                          detail=f"no link information: {unread or 'no GPU link read'}")
    label = size_label(max(sizes))
    wanted = re.compile(rf"^(?:{'|'.join(OPS)})_{re.escape(label)}_busbw_gbps$")
    measured = {f.name: f.value for f in figures if wanted.match(f.name)}
    if not measured:
        return BenchCheck(name=name, status="skipped", detail=f"no intra-node figure at {label}")
    worst_name, worst = min(measured.items(), key=lambda kv: kv[1])
    fabric = gpus[0].fabric
    below = links_below_peers(gpus)
    notes = [n for g in gpus for n in g.notes]
    why = "".join(f"; {p}" for p in below + notes)
    detail = (f"{worst_name} {worst:.4g} GB/s against {expected:.4g} GB/s the GPUs' "
              f"{fabric} links allow ({worst / expected:.0%})")
    if worst >= min_fraction * expected:
        return BenchCheck(name=name, status="ok", detail=detail + why)
    return BenchCheck(name=name, status="failed",
                      detail=f"{detail}, below {min_fraction:.0%}{why}")


def _label(index: int, bdf: str | None) -> str:
    return f"GPU {index} ({bdf})" if bdf else f"GPU {index}"


def _describe(g: GpuLinks) -> str:
    if g.fabric == "PCIe":
        return f"PCIe at {g.gbps:.3g} GB/s" if g.rates else "no PCIe link"
    rates = sorted(set(g.rates))
    each = " and ".join(f"{r:.4g}" for r in rates) or "0"
    return f"{len(g.rates)} {g.fabric} links up at {each} GB/s ({g.gbps:.4g} GB/s)"
