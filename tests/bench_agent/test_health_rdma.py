"""The RDMA probes (services/bench/health/rdma.py): ibstat parsed from
recorded outputs, sysfs trees built from recorded sysfs values (sources in
fixtures/health/README.md), and each probe ok / failed / not applicable /
unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bench.health import CATALOGUE
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable, run_tool
from services.bench.health.rdma import (
    Gid,
    Port,
    check_nic_count,
    check_rdma_gids,
    check_rdma_ports,
    parse_ibstat,
    parse_rate,
    parse_sysfs_state,
    port_problems,
    usable_roce_gid,
)

FIXTURES = Path(__file__).parent / "fixtures" / "health"

# Values of leptonai/gpud's recorded /sys/class/infiniband tree of an H100 node
# (sys-class-infiniband-h100.0): eight ConnectX-7 NDR ports and a BlueField-3 bond.
H100_IB = {
    f"mlx5_{i}": ("MT4129", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", "InfiniBand")
    for i in (0, 1, 4, 5, 6, 7, 8, 9)
}
H100_IB["mlx5_bond_0"] = ("MT41692", "4: ACTIVE", "5: LinkUp", "200 Gb/sec (2X NDR)", "Ethernet")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def ib_tree(
    root: Path, devices: dict[str, tuple[str, str, str, str, str]], *, skip: tuple[str, ...] = ()
) -> Path:
    for dev, (hca, state, phys, rate, layer) in devices.items():
        base = root / "sys/class/infiniband" / dev
        write(base / "hca_type", hca)
        for name, value in (
            ("state", state),
            ("phys_state", phys),
            ("rate", rate),
            ("link_layer", layer),
        ):
            if name not in skip:
                write(base / "ports/1" / name, value)
    return root


def replay(stdout: str = "", *, rc: int = 0, error: str | None = None):
    calls = []

    def run(argv, timeout_s):
        calls.append(list(argv))
        if error:
            raise ToolUnavailable(error)
        return ToolOutput(rc, stdout, "")

    run.calls = calls  # type: ignore[attr-defined]
    return run


# ---------------------------------------------------------------------- parsers


def test_ibstat_roce_node_with_a_polling_and_a_disabled_port():
    ports = {p.name: p for p in parse_ibstat(fixture("ibstat_h100_roce_some_down.txt"))}
    assert len(ports) == 12
    assert ports["mlx5_11/1"] == Port("mlx5_11", 1, "DOWN", "Polling", 40.0, "Ethernet", "MT4129")
    assert ports["mlx5_5/1"].phys_state == "Disabled"
    assert ports["mlx5_0/1"].rate_gbps == 400 and ports["mlx5_1/1"].rate_gbps == 100
    problems = port_problems(ports.values(), min_rate_gbps=None)
    # CX-6 front-end ports at 100 beside CX-7 rails at 400 are peers of their own type
    assert problems == ["mlx5_11/1 DOWN (Polling)", "mlx5_5/1 DOWN (Disabled)"]


def test_ibstat_infiniband_node_all_active():
    ports = parse_ibstat(fixture("ibstat_h100_ib_all_active.txt"))
    assert [p.device for p in ports][-1] == "mlx5_bond_0" and len(ports) == 9
    assert {p.link_layer for p in ports} == {"InfiniBand", "Ethernet"}
    assert port_problems(ports, min_rate_gbps=None) == []
    assert port_problems(ports, min_rate_gbps=400) == ["mlx5_bond_0/1 at 200 Gb/s, below 400"]


def test_ibstat_partial_output_before_ibpanic():
    ports = parse_ibstat(fixture("ibstat_a100_ibpanic.txt"))
    assert ports[-1].device == "mlx5_7" and all(p.state == "ACTIVE" for p in ports)


def test_ibstat_garbage_is_an_error():
    with pytest.raises(ValueError):
        parse_ibstat("ibpanic: [1323906] main: stat of IB device 'mlx5_8' failed\n")


def test_sysfs_value_parsers():
    assert parse_sysfs_state("4: ACTIVE") == "ACTIVE"
    assert parse_sysfs_state("5: LinkUp") == "LinkUp"
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("bogus") is None


def test_a_port_at_half_its_peers_rate_is_named():
    ports = [
        Port(f"mlx5_{i}", 1, "ACTIVE", "LinkUp", 400.0, "InfiniBand", "MT4129") for i in range(3)
    ]
    ports.append(Port("mlx5_3", 1, "ACTIVE", "LinkUp", 200.0, "InfiniBand", "MT4129"))
    assert port_problems(ports, min_rate_gbps=None) == [
        "mlx5_3/1 at 200 Gb/s, its InfiniBand MT4129 peers at 400"
    ]


# ---------------------------------------------------------------------- rdma_ports


def test_rdma_ports_ok_on_the_recorded_h100_tree(tmp_path):
    found = check_rdma_ports(
        ProbeContext(root=ib_tree(tmp_path, H100_IB), run=replay(error="unused"))
    )
    assert found.status == "ok", found
    assert "9 ports" in found.detail


def test_rdma_ports_failed_names_down_and_slow_ports(tmp_path):
    devices = dict(H100_IB)
    # changed from the recorded tree: one port down, one trained at HDR
    devices["mlx5_4"] = ("MT4129", "1: DOWN", "2: Polling", "40 Gb/sec (4X QDR)", "InfiniBand")
    devices["mlx5_5"] = ("MT4129", "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "InfiniBand")
    found = check_rdma_ports(ProbeContext(root=ib_tree(tmp_path, devices)))
    assert found.status == "failed"
    assert "mlx5_4/1 DOWN (Polling)" in found.detail
    assert "mlx5_5/1 at 200 Gb/s, its InfiniBand MT4129 peers at 400" in found.detail


def test_rdma_ports_ignore_devices(tmp_path):
    devices = dict(H100_IB)
    devices["mlx5_4"] = ("MT4129", "1: DOWN", "3: Disabled", "40 Gb/sec (4X QDR)", "InfiniBand")
    ctx = ProbeContext(root=ib_tree(tmp_path, devices), options={"ignore_devices": "mlx5_4"})
    assert check_rdma_ports(ctx).status == "ok"


def test_rdma_ports_not_applicable_without_infiniband(tmp_path):
    assert check_rdma_ports(ProbeContext(root=tmp_path)).status == "not_applicable"


def test_rdma_ports_fills_what_sysfs_lacks_from_ibstat(tmp_path):
    root = ib_tree(tmp_path, H100_IB, skip=("rate",))
    run = replay(fixture("ibstat_h100_ib_all_active.txt"))
    found = check_rdma_ports(ProbeContext(root=root, run=run))
    assert found.status == "ok" and run.calls == [["ibstat"]]
    assert "200/400 Gb/s" in found.detail


@pytest.mark.parametrize(
    "run, reason",
    [
        (replay(error="ibstat: not installed"), "ibstat: not installed"),
        (replay(error="ibstat: no answer within 30 s"), "no answer within 30 s"),
        (replay("Segmentation fault\n", rc=139), "no CA in the ibstat output"),
    ],
)
def test_rdma_ports_unknown_when_ibstat_cannot_fill_in(tmp_path, run, reason):
    found = check_rdma_ports(ProbeContext(root=ib_tree(tmp_path, H100_IB, skip=("rate",)), run=run))
    assert found.status == "unknown" and reason in found.detail


# ---------------------------------------------------------------------- rdma_gids


def show_gids_rows(name: str) -> list[tuple[str, int, int, str, str, str]]:
    rows = []
    for line in fixture(name).splitlines()[2:]:
        fields = line.split()
        if len(fields) >= 6:
            version, ndev = fields[-2], fields[-1]
            rows.append((fields[0], int(fields[1]), int(fields[2]), fields[3], version, ndev))
    return rows


def gid_tree(root: Path, rows, *, link_layer: str = "Ethernet") -> Path:
    """sysfs as show_gids reads it: gids/<i>, gid_attrs/types/<i> ("IB/RoCE v1"
    or "RoCE v2", the kernel's names) and gid_attrs/ndevs/<i>."""
    for dev, port, index, gid, version, ndev in rows:
        base = root / "sys/class/infiniband" / dev / "ports" / str(port)
        write(base / "state", "4: ACTIVE")
        write(base / "phys_state", "5: LinkUp")
        write(base / "rate", "100 Gb/sec (4X EDR)")
        write(base / "link_layer", link_layer)
        write(base / "gids" / str(index), gid)
        write(base / "gid_attrs/types" / str(index), "RoCE v2" if version == "v2" else "IB/RoCE v1")
        write(base / "gid_attrs/ndevs" / str(index), ndev)
    return root


def test_rdma_gids_ok_with_an_ipv4_roce_v2_gid(tmp_path):
    root = gid_tree(tmp_path, show_gids_rows("show_gids_cx6_spectrumscale.txt"))
    # an all-zero slot: the kernel refuses to read its type (EINVAL); no file here
    write(
        root / "sys/class/infiniband/mlx5_0/ports/1/gids/6",
        "0000:0000:0000:0000:0000:0000:0000:0000",
    )
    found = check_rdma_gids(ProbeContext(root=root))
    assert found.status == "ok", found
    assert found.detail == "mlx5_0/1 GID 5 RoCE v2 172.19.0.60 (ens1f0)"


def test_rdma_gids_failed_with_link_local_gids_only(tmp_path):
    rows = show_gids_rows("show_gids_cx6_spectrumscale.txt")[:4]  # the netdev has no IPv4 yet
    found = check_rdma_gids(ProbeContext(root=gid_tree(tmp_path, rows)))
    assert found.status == "failed"
    assert "mlx5_0/1 (4 GIDs: IB/RoCE v1, RoCE v2)" in found.detail


def test_rdma_gids_not_applicable_on_infiniband(tmp_path):
    rows = show_gids_rows("show_gids_cx6_spectrumscale.txt")
    assert (
        check_rdma_gids(ProbeContext(root=gid_tree(tmp_path, rows, link_layer="InfiniBand"))).status
        == "not_applicable"
    )
    assert check_rdma_gids(ProbeContext(root=tmp_path / "none")).status == "not_applicable"


def test_a_global_ipv6_roce_v2_gid_is_usable():
    # rows of an MI355X node's show_gids (kvcache-ai/Mooncake issue 1617): ULA addresses, v2 only
    gids = [
        Gid(0, "fe80:0000:0000:0000:0690:81ff:fe39:e3e8", "RoCE v2", "enp105s0"),
        Gid(1, "fd93:16d3:59b6:010d:0690:81ff:fe39:e3e8", "RoCE v2", "enp105s0"),
    ]
    assert usable_roce_gid(gids) == gids[1]
    assert usable_roce_gid(gids[:1]) is None


# ---------------------------------------------------------------------- nic_count


def net_tree(root: Path, physical: list[str], virtual: list[str]) -> Path:
    for name in physical:
        (root / "sys/class/net" / name / "device").mkdir(parents=True)
    for name in virtual:
        (root / "sys/class/net" / name).mkdir(parents=True)
    return root


def test_nic_count_not_applicable_until_configured(tmp_path):
    assert check_nic_count(ProbeContext(root=tmp_path)).status == "not_applicable"


def test_nic_count_ok_and_failed(tmp_path):
    root = ib_tree(tmp_path, H100_IB)
    net_tree(root, ["ens1f0np0", "ibp26s0", "ibp60s0"], ["lo", "docker0", "ifb0"])
    ok = check_nic_count(
        ProbeContext(root=root, options={"expected_rdma_devices": 9, "expected_nics": 3})
    )
    assert ok.status == "ok", ok
    missing = check_nic_count(
        ProbeContext(
            root=root,
            options={
                "expected_rdma_devices": 8,
                "rdma_name_regex": r"mlx5_\d+",
                "expected_nics": 4,
                "nic_name_regex": "ib.*",
            },
        )
    )
    assert missing.status == "failed"
    assert "2 NICs of 4 expected (ibp26s0, ibp60s0)" in missing.detail
    assert "RDMA" not in missing.detail  # eight mlx5_<n> are there


# ---------------------------------------------------------------------- this machine


@pytest.mark.parametrize("kind", ["rdma_ports", "rdma_gids", "nic_count"])
def test_probe_on_this_machine_never_fails(kind):
    entry = CATALOGUE[kind]
    found = entry.run(ProbeContext(run=run_tool, options=dict(entry.options), timeout_s=10))
    assert found.status in ("ok", "not_applicable", "unknown"), found
