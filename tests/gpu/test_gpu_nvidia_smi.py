"""nvidia-smi CSV and XML parsing, against real recorded outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.gpu import QUERY_FIELDS, ToolOutputError, parse_nvidia_smi_csv, parse_nvidia_smi_xml

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1024**2

# The --query-gpu lists the recorded outputs were produced with (see fixtures/README.md).
RTX2080_FIELDS = [
    "power.limit", "power.min_limit", "power.max_limit", "memory.total", "vbios_version",
    "driver_version", "name", "gpu_uuid", "power.draw", "temperature.gpu", "temperature.memory",
    "clocks.current.graphics", "clocks.sm", "clocks.mem", "utilization.gpu",
    "utilization.memory", "fan.speed", "pcie.link.width.current", "pstate",
]  # fmt: skip
I3PYSTATUS_FIELDS = [
    "memory.total", "memory.free", "memory.used", "temperature.gpu", "fan.speed",
    "utilization.gpu", "utilization.memory",
]  # fmt: skip


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_csv_with_header_and_header_units_tesla_p100() -> None:
    inventory = parse_nvidia_smi_csv(fixture("nvidia_smi_query_tesla_p100_header.csv"))

    assert inventory.tool == "nvidia-smi"
    assert len(inventory.gpus) == 1
    gpu = inventory.gpus[0]
    assert gpu.index == 0  # no index column: numbered by row
    assert gpu.name == "Tesla P100-PCIE-16GB"
    assert gpu.uuid == "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"
    assert gpu.utilization_pct == 0.0
    assert gpu.vram_used_bytes == 0
    assert gpu.temp_edge_c == 37.0
    assert gpu.power_w == 28.16
    assert (gpu.sclk_mhz, gpu.mclk_mhz) == (405.0, 715.0)
    assert gpu.vram_total_bytes is None  # memory.total was not queried


def test_csv_noheader_nounits_rtx2080_with_plain_na() -> None:
    inventory = parse_nvidia_smi_csv(
        fixture("nvidia_smi_query_rtx2080_noheader_nounits.csv"), RTX2080_FIELDS
    )

    gpu = inventory.gpus[0]
    assert gpu.name == "GeForce RTX 2080"
    assert gpu.uuid == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"
    assert gpu.vram_total_bytes == 7979 * MIB
    assert (gpu.power_w, gpu.power_cap_w) == (176.98, 200.0)
    assert gpu.temp_edge_c == 45.0
    assert gpu.temp_memory_c is None  # printed as bare "N/A"
    assert (gpu.sclk_mhz, gpu.mclk_mhz) == (1965.0, 7199.0)
    assert gpu.utilization_pct == 86.0
    assert gpu.pcie_link_width == 8
    assert inventory.driver_version == "440.64"


@pytest.mark.parametrize("name", ["nvidia_smi_query_na.csv", "nvidia_smi_query_not_supported.csv"])
def test_csv_bracketed_unsupported_markers(name: str) -> None:
    gpu = parse_nvidia_smi_csv(fixture(name), I3PYSTATUS_FIELDS).gpus[0]

    assert gpu.vram_total_bytes == 2004 * MIB
    assert gpu.vram_used_bytes == 0
    assert gpu.temp_edge_c == 44.0
    assert gpu.utilization_pct == 0.0


def test_csv_units_inside_values_rtx2080_super() -> None:
    inventory = parse_nvidia_smi_csv(fixture("nvidia_smi_query_rtx2080super_units.csv"))

    gpu = inventory.gpus[0]
    assert gpu.index == 0
    assert gpu.name == "NVIDIA GeForce RTX 2080 SUPER"
    assert gpu.vram_used_bytes == 575 * MIB
    assert gpu.pci_bus == "00000000:01:00.0"
    assert gpu.serial is None  # "[N/A]"
    assert inventory.driver_version == "466.63"


def test_xml_a100_sxm4_with_mig_enabled() -> None:
    inventory = parse_nvidia_smi_xml(fixture("nvidia_smi_q_x_a100_sxm4.xml"))

    assert inventory.driver_version == "535.54.03"
    assert len(inventory.gpus) == 1
    gpu = inventory.gpus[0]
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.serial == "1650522003820"
    assert gpu.pci_bus == "00000000:01:00.0"
    assert gpu.vram_total_bytes == 81920 * MIB
    assert gpu.vram_used_bytes == 50 * MIB
    assert (gpu.temp_edge_c, gpu.temp_memory_c) == (27.0, 44.0)
    assert (gpu.power_w, gpu.power_cap_w) == (67.03, 500.0)
    assert (gpu.sclk_mhz, gpu.mclk_mhz) == (1275.0, 1593.0)
    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (0, 0)
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (16.0, 16)
    assert gpu.utilization_pct is None  # N/A while MIG is enabled


def test_xml_h200() -> None:
    inventory = parse_nvidia_smi_xml(fixture("nvidia_smi_q_x_h200.xml"))
    assert inventory.driver_version == "580.159.04"
    (gpu,) = inventory.gpus
    assert (gpu.name, gpu.pci_bus, gpu.serial) == ("NVIDIA H200", "00000000:00:06.0",
                                                   "1654124046840")
    assert gpu.vram_total_bytes == 143771 * MIB
    assert (gpu.temp_edge_c, gpu.temp_memory_c) == (35.0, 36.0)
    assert (gpu.power_w, gpu.power_cap_w) == (77.23, 700.0)
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (32.0, 16)  # gen 5 x16
    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (0, 0)


def test_csv_of_the_agents_own_query_on_an_h200() -> None:
    # Recorded with exactly the agent's field list (runner.NVIDIA_QUERY_ARGS).
    (gpu,) = parse_nvidia_smi_csv(fixture("nvidia_smi_query_h200_agent_fields.csv"),
                                  QUERY_FIELDS).gpus
    assert (gpu.index, gpu.name) == (0, "NVIDIA H200")
    assert gpu.uuid == "GPU-26fcf95b-c97a-5cac-bc6a-72c359191761"
    assert (gpu.utilization_pct, gpu.vram_used_bytes, gpu.vram_total_bytes) == (
        0.0, 0, 143771 * MIB)
    assert (gpu.temp_edge_c, gpu.temp_memory_c) == (35.0, 37.0)
    assert (gpu.power_w, gpu.power_cap_w, gpu.sclk_mhz, gpu.mclk_mhz) == (
        76.81, 700.0, 345.0, 3201.0)
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (32.0, 16)


def test_xml_tesla_t4_older_power_schema() -> None:
    gpu = parse_nvidia_smi_xml(fixture("nvidia_smi_q_x_tesla_t4.xml")).gpus[0]

    assert gpu.name == "Tesla T4"
    assert (gpu.power_w, gpu.power_cap_w) == (26.78, 70.0)
    assert gpu.vram_total_bytes == 15360 * MIB
    assert gpu.vram_used_bytes == 1032 * MIB
    assert gpu.temp_edge_c == 40.0 and gpu.temp_memory_c is None
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (8.0, 8)  # gen 3, x8 of x16
    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (0, 0)
    assert gpu.utilization_pct == 0.0


def test_xml_old_single_double_bit_ecc_schema() -> None:
    raw = (
        "<nvidia_smi_log><gpu><ecc_errors><volatile>"
        "<single_bit><total>3</total></single_bit><double_bit><total>1</total></double_bit>"
        "</volatile></ecc_errors></gpu></nvidia_smi_log>"
    )
    gpu = parse_nvidia_smi_xml(raw).gpus[0]

    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (3, 1)


def test_default_query_fields_match_the_agents_query() -> None:
    assert QUERY_FIELDS[:3] == ("index", "uuid", "name")
    assert "ecc.errors.uncorrected.volatile.total" in QUERY_FIELDS
    assert len(QUERY_FIELDS) == 16


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "no output"),
        ("   \n", "no output"),
        ("index, name\n", "header but no GPU rows"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "row 1 has 1 values, expected 16",
        ),
        ("0, GPU-x, H100, 12, 5, 80, hot" + ", 1" * 9, "'temperature.gpu'"),
        ("index, memory.used [parsecs]\n0, 12", "parsecs"),
        ("index, name\n0, A100\n0, A100", "GPU index 0 appears twice"),
    ],
)
def test_csv_malformed_input_raises_tool_output_error(raw: str, says: str) -> None:
    with pytest.raises(ToolOutputError) as caught:
        parse_nvidia_smi_csv(raw)

    assert caught.value.tool == "nvidia-smi"
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "no output"),
        ("<nvidia_smi_log><gpu>", "not XML"),
        ("<html></html>", "expected <nvidia_smi_log>"),
        (
            "<nvidia_smi_log><gpu><temperature><gpu_temp>warm</gpu_temp></temperature></gpu>"
            "</nvidia_smi_log>",
            "temperature/gpu_temp",
        ),
    ],
)
def test_xml_malformed_input_raises_tool_output_error(raw: str, says: str) -> None:
    with pytest.raises(ToolOutputError, match="nvidia-smi") as caught:
        parse_nvidia_smi_xml(raw)

    assert says in str(caught.value)
