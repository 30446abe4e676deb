"""nvidia-smi nvlink -s parsed from real recordings: a bridged H100 PCIe pair
(12 of 18 links up on each GPU, by design) and a V100 with two links down
(see fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.gpu import ToolOutputError, parse_nvlink_status

FIXTURES = Path(__file__).parent / "fixtures"
H100_PAIR = (FIXTURES / "nvidia_smi_nvlink_s_h100_pcie_x2.txt").read_text(encoding="utf-8")
V100 = (FIXTURES / "nvidia_smi_nvlink_s_v100_inactive.txt").read_text(encoding="utf-8")


def test_a_bridged_h100_pair_has_twelve_links_up_on_each_gpu() -> None:
    gpus = parse_nvlink_status(H100_PAIR)

    assert sorted(gpus) == [0, 1]
    assert gpus[0].name == "NVIDIA H100 PCIe"
    assert gpus[1].uuid == "GPU-9b1446e2-8a89-4cf6-b68c-a98d99e958d3"
    for gpu in gpus.values():
        assert len(gpu.links) == 18
        assert sorted(n for n, rate in gpu.links.items() if rate is None) == [4, 5, 10, 11, 16, 17]
        assert set(gpu.active.values()) == {26.562} and len(gpu.active) == 12


def test_inactive_links_of_a_v100_are_read_as_down() -> None:
    gpus = parse_nvlink_status(V100)  # the reporter's "...." and "(UUID: ...)" included

    assert list(gpus) == [3]
    assert gpus[3].links == {0: 25.781, 1: 25.781, 2: 25.781, 3: None, 4: 25.781, 5: None}
    assert gpus[3].uuid == "..."


def test_no_gpu_header_is_no_nvlink_and_a_zero_rate_is_down() -> None:
    assert parse_nvlink_status("") == {}
    assert parse_nvlink_status("NVIDIA-SMI has failed because it couldn't communicate\n") == {}
    zero = parse_nvlink_status("GPU 0: NVIDIA A100-SXM4-80GB\n\t Link 0: 0 GB/s\n")
    assert zero[0].links == {0: None} and zero[0].active == {}


@pytest.mark.parametrize("text, why", [
    ("\t Link 0: 25 GB/s\n", "before any GPU"),
    ("GPU 0: X\n\t Link 0: fast\n", "rate 'fast'"),
    ("GPU 0: X\n\t Link 0: 25 GB/s\n\t Link 0: 25 GB/s\n", "appears twice"),
    ("GPU 0: X\nGPU 0: X\n", "GPU 0 appears twice"),
])
def test_output_it_cannot_read_is_an_error_naming_the_tool(text: str, why: str) -> None:
    with pytest.raises(ToolOutputError, match=why) as raised:
        parse_nvlink_status(text)
    assert raised.value.tool == "nvidia-smi"
