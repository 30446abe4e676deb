"""What the node's links promise, for judging its collectives (pure).

Between nodes a rail-optimized GPU node gives each GPU rank one NIC, so an
inter-node all-reduce's or all-to-all's bus bandwidth approaches one port's
rate (nccl-tests' busbw is defined so that it does). The expected figure is
the rate of the node's fastest active RDMA port class (``/sys/class/
infiniband``, read by ``health.rdma``) in GB/s; a figure far below it fails,
and the reason names any port running below its peers (a NIC at half rate),
which is usually why.
"""

from __future__ import annotations

from collections.abc import Sequence

from libs.events import BenchCheck, Figure
from services.bench.collectives import size_label
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
