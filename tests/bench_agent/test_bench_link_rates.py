"""Inter-node bus bandwidth against what the node's RDMA ports allow: a
figure far below the port rate fails, and a NIC at half its peers' rate is
named in the reason."""

from __future__ import annotations

from libs.events import Figure
from services.bench.health.rdma import Port
from services.bench.link_rates import expected_internode_gbps, internode_check

GIB = 1 << 30


def rails(*rates: float) -> list[Port]:
    return [Port(device=f"mlx5_{i}", port=1, state="ACTIVE", phys_state="LinkUp",
                 rate_gbps=r, link_layer="InfiniBand", hca_type="MT4129")
            for i, r in enumerate(rates)]


def busbw(allreduce: float, alltoall: float) -> list[Figure]:
    return [Figure(name="internode_allreduce_64MiB_busbw_gbps", value=10.0, unit="GB/s"),
            Figure(name="internode_allreduce_1GiB_busbw_gbps", value=allreduce, unit="GB/s"),
            Figure(name="internode_alltoall_1GiB_busbw_gbps", value=alltoall, unit="GB/s")]


def test_a_port_at_half_rate_is_named_when_the_bandwidth_falls_short() -> None:
    ports = rails(400, 400, 200, 400)
    assert expected_internode_gbps(ports) == 50.0  # 400 Gb/s
    check = internode_check(busbw(44.0, 15.0), ports, sizes=[64 << 20, GIB], min_fraction=0.4)
    assert check.status == "failed"
    assert check.detail.startswith("internode_alltoall_1GiB_busbw_gbps 15 GB/s against 50 GB/s")
    assert "mlx5_2/1 at 200 Gb/s, its InfiniBand MT4129 peers at 400" in check.detail


def test_a_healthy_node_passes_and_no_rdma_expects_nothing() -> None:
    ok = internode_check(busbw(44.0, 38.0), rails(400, 400), sizes=[GIB], min_fraction=0.4)
    assert ok.status == "ok" and "(76%)" in ok.detail
    none = internode_check(busbw(1.0, 1.0), [], sizes=[GIB], min_fraction=0.4)
    assert none.status == "skipped" and "no active RDMA port" in none.detail
    down = [Port(device="mlx5_0", port=1, state="DOWN", rate_gbps=400)]
    assert expected_internode_gbps(down) is None
