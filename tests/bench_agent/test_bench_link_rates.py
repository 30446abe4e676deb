"""Bus bandwidth against what the node's links allow. Between nodes, the
RDMA ports: a figure far below the port rate fails, and a NIC at half its
peers' rate is named in the reason. Within a node, the GPUs' XGMI, NVLink or
PCIe links: a figure far below what they carry fails, naming a GPU whose
links run below its peers'."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from libs.events import Figure
from libs.gpu import parse_amd_smi_xgmi_links, parse_nvlink_status
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable
from services.bench.health.pcie import Link
from services.bench.health.rdma import Port
from services.bench.link_rates import (
    GpuLinks,
    expected_internode_gbps,
    expected_intranode_gbps,
    from_nvlink,
    from_pcie,
    from_xgmi,
    internode_check,
    intranode_check,
    pcie_gbps,
)
from services.bench.node_links import read_gpu_links
from tests.bench_agent.test_health_pcie import gpu, nic

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


# --------------------------------------------------------------------------- within a node
#
# The link readings are real recordings (tests/gpu/fixtures/README.md): an
# 8x MI300X `amd-smi xgmi -m --json` and a bridged 2x H100 PCIe
# `nvidia-smi nvlink -s`. A degraded link is one value of them changed, as
# each test says; the PCIe trees hold the kernel's sysfs formats.

GPU_FIXTURES = Path(__file__).parents[1] / "gpu" / "fixtures"
MI300X = (GPU_FIXTURES / "amd_smi_xgmi_metric_mi300x8.json").read_text(encoding="utf-8")
H100_PAIR = (GPU_FIXTURES / "nvidia_smi_nvlink_s_h100_pcie_x2.txt").read_text(encoding="utf-8")
SIZES = [64 << 20, GIB]


def intranode(allreduce: float, allgather: float, alltoall: float) -> list[Figure]:
    """The standard level's intra-node figures, plus ones the check must not read."""
    return [Figure(name="allreduce_64MiB_busbw_gbps", value=1.0, unit="GB/s"),
            Figure(name="allreduce_1GiB_busbw_gbps", value=allreduce, unit="GB/s"),
            Figure(name="allgather_1GiB_busbw_gbps", value=allgather, unit="GB/s"),
            Figure(name="alltoall_1GiB_busbw_gbps", value=alltoall, unit="GB/s"),
            Figure(name="internode_alltoall_1GiB_busbw_gbps", value=0.5, unit="GB/s"),
            Figure(name="gpu3_membw_copy_gbps", value=0.5, unit="GB/s")]


def mi300x(*, down: tuple[int, int] | None = None) -> list[GpuLinks]:
    doc = json.loads(MI300X)
    if down is not None:  # a link down reads "N/A" from both of its GPUs
        a, b = down
        for x, y in ((a, b), (b, a)):
            doc[x]["link_metrics"]["links"][y].update(read="N/A", write="N/A")
    return from_xgmi(parse_amd_smi_xgmi_links(json.dumps(doc)))


def test_a_full_xgmi_mesh_expects_seven_links_of_each_gpu() -> None:
    links = mi300x()
    assert len(links) == 8 and all(g.rates == (64.0,) * 7 for g in links)
    assert expected_intranode_gbps(links) == 448.0  # 7 links x 512 Gb/s / 8
    check = intranode_check(intranode(310.0, 290.0, 250.0), links, sizes=SIZES,
                            min_fraction=0.3)
    assert check.name == "intranode_link_rate" and check.status == "ok"
    assert check.detail == ("alltoall_1GiB_busbw_gbps 250 GB/s against 448 GB/s the GPUs' "
                            "XGMI links allow (56%)")


def test_an_xgmi_link_down_is_named_when_the_bandwidth_falls_short() -> None:
    links = mi300x(down=(5, 6))  # changed from the recording: GPU 5 <-> GPU 6 down
    assert expected_intranode_gbps(links) == 448.0  # what the healthy GPUs allow
    check = intranode_check(intranode(120.0, 118.0, 101.0), links, sizes=SIZES,
                            min_fraction=0.3)
    assert check.status == "failed"
    assert check.detail.startswith("alltoall_1GiB_busbw_gbps 101 GB/s against 448 GB/s")
    assert ", below 30%" in check.detail
    assert ("GPU 5 (0000:af:00.0) has 6 XGMI links up at 64 GB/s (384 GB/s), its peers "
            "7 XGMI links up at 64 GB/s (448 GB/s)") in check.detail
    assert "GPU 6 (0000:bf:00.0) has 6 XGMI links" in check.detail
    assert "GPU 4 " not in check.detail


def test_a_bridged_nvlink_pair_and_a_link_that_went_down() -> None:
    pair = from_nvlink(parse_nvlink_status(H100_PAIR))
    # 12 x 26.562: the same page measured 256.62 GB/s GPU to GPU (80%).
    assert expected_intranode_gbps(pair) == pytest.approx(318.744)
    ok = intranode_check(intranode(240.0, 230.0, 225.0), pair, sizes=SIZES, min_fraction=0.3)
    assert ok.status == "ok" and "NVLink links allow (71%)" in ok.detail

    # Changed from the recording: GPU 1's link 0 no longer trained.
    lines = H100_PAIR.splitlines()
    at = lines.index("GPU 1: NVIDIA H100 PCIe (UUID: GPU-9b1446e2-8a89-4cf6-b68c-a98d99e958d3)")
    lines[at + 1] = lines[at + 1].replace("26.562 GB/s", "<inactive>")
    degraded = from_nvlink(parse_nvlink_status("\n".join(lines)))
    failed = intranode_check(intranode(60.0, 58.0, 55.0), degraded, sizes=SIZES,
                             min_fraction=0.3)
    assert failed.status == "failed"
    assert ("GPU 1 has 11 NVLink links up at 26.56 GB/s (292.2 GB/s), its peers 12 NVLink "
            "links up at 26.56 GB/s (318.7 GB/s)") in failed.detail
    assert "GPU 0 has" not in failed.detail


def pcie_gpu(bdf: str, *, speed: float = 32.0, width: int | None = 16) -> Link:
    return Link(bdf, "gpu", speed, width, 32.0, 16)


def test_pcie_without_a_fabric_expects_one_direction_of_the_link() -> None:
    assert pcie_gbps(16.0, 16) == pytest.approx(31.5, abs=0.01)  # Gen4 x16
    assert pcie_gbps(32.0, 16) == pytest.approx(63.0, abs=0.03)  # Gen5 x16
    assert pcie_gbps(2.5, 16) == 4.0  # Gen1: 8b/10b
    # An idle GPU at 2.5 GT/s is counted at the speed both ends allow, and
    # only noted; the other one is at x8, which no power saving explains.
    links = from_pcie([(pcie_gpu("0000:05:00.0"), None),
                       (pcie_gpu("0000:06:00.0", speed=2.5), None),
                       (pcie_gpu("0000:07:00.0", width=8), None)])
    assert expected_intranode_gbps(links) == pytest.approx(63.0, abs=0.03)
    check = intranode_check(intranode(9.0, 9.0, 8.0), links, sizes=SIZES, min_fraction=0.3)
    assert check.status == "failed"
    assert "GPU 0000:07:00.0 has PCIe at 31.5 GB/s, its peers PCIe at 63 GB/s" in check.detail
    assert "GPU 0000:07:00.0 at x8, capable of x16" in check.detail
    assert "GPU 0000:06:00.0 at 2.5 GT/s, capable of 32 (idle GPUs retrain lower)" in check.detail
    assert "0000:06:00.0 has" not in check.detail
    # The upstream port caps what is expected: a Gen5 GPU in a Gen4 slot.
    slot = Link("0000:00:01.1", "port", 16.0, 16, 16.0, 16)
    capped = from_pcie([(pcie_gpu("0000:05:00.0", speed=16.0), slot)])
    assert expected_intranode_gbps(capped) == pytest.approx(31.5, abs=0.01)


def test_no_link_information_or_no_figure_skips_and_never_fails() -> None:
    links, why = read_gpu_links(ProbeContext())  # this machine: no GPU
    skipped = intranode_check(intranode(1.0, 1.0, 1.0), links, sizes=SIZES, min_fraction=0.3,
                              unread=why)
    assert skipped.status == "skipped" and skipped.detail.startswith("no link information: ")
    none = intranode_check(intranode(1.0, 1.0, 1.0), mi300x(), sizes=[256 << 20],
                           min_fraction=0.3)
    assert none.status == "skipped" and none.detail == "no intra-node figure at 256MiB"


def test_the_node_is_read_fabric_first_and_a_failing_tool_is_a_reason(tmp_path: Path) -> None:
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)

    def amd_smi(argv: Sequence[str], timeout_s: float) -> ToolOutput:
        assert list(argv) == ["amd-smi", "xgmi", "-m", "--json"]
        return ToolOutput(0, MI300X, "")

    links, why = read_gpu_links(ProbeContext(root=tmp_path, run=amd_smi))
    assert why == "" and [g.fabric for g in links] == ["XGMI"] * 8

    def missing(argv: Sequence[str], timeout_s: float) -> ToolOutput:
        raise ToolUnavailable(f"{argv[0]}: not installed")

    links, why = read_gpu_links(ProbeContext(root=tmp_path, run=missing))
    assert links == [] and why == "XGMI: amd-smi: not installed"

    def garbled(argv: Sequence[str], timeout_s: float) -> ToolOutput:
        return ToolOutput(0, "GPU 0: X\n\t Link 0: fast\n", "")

    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    links, why = read_gpu_links(ProbeContext(root=tmp_path, run=garbled))
    assert links == [] and "NVLink: nvidia-smi: nvlink: GPU 0 link 0 has rate 'fast'" in why


def test_pcie_links_are_read_from_sysfs_when_there_is_no_fabric(tmp_path: Path) -> None:
    gpu(tmp_path, "0000:05:00.0")
    gpu(tmp_path, "0000:06:00.0", width="8")
    nic(tmp_path, "0000:0c:00.0")  # a NIC's link is not a GPU's

    links, why = read_gpu_links(ProbeContext(root=tmp_path))

    assert why == "" and [g.gpu for g in links] == ["GPU 0000:05:00.0", "GPU 0000:06:00.0"]
    assert [round(g.gbps, 1) for g in links] == [63.0, 31.5]
    assert links[1].problems == ("GPU 0000:06:00.0 at x8, capable of x16",)
