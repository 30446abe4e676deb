"""rocm-smi JSON and concise-table parsing, against real recorded outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.gpu import ToolOutputError, parse_rocm_smi, parse_rocm_smi_json, parse_rocm_smi_table

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_showallinfo_json_four_mi100() -> None:
    inventory = parse_rocm_smi_json(fixture("rocm_smi_showallinfo_mi100x4.json"))

    assert inventory.tool == "rocm-smi"
    assert inventory.driver_version == "6.3.6"
    assert [g.index for g in inventory.gpus] == [0, 1, 2, 3]
    card1 = inventory.gpus[1]
    assert (card1.temp_edge_c, card1.temp_junction_c, card1.temp_memory_c) == (55.0, 58.0, 54.0)
    assert card1.power_w == 44.0
    assert card1.uuid == "0x4edfb117a17a07d"
    for gpu in inventory.gpus:
        assert gpu.name == "Arcturus GL-XL [Instinct MI100]"
        assert gpu.vram_total_bytes == 34_342_961_152
        assert gpu.vram_used_bytes == 6_750_208
        assert gpu.power_cap_w == 290.0
        assert (gpu.sclk_mhz, gpu.mclk_mhz) == (300.0, 1200.0)
        assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (16.0, 16)
        assert gpu.utilization_pct == 0.0
        assert gpu.serial is None  # "N/A"
    assert inventory.gpus[3].pci_bus == "0000:E3:00.0"
    assert inventory.gpus[0].hottest_c == 55.0


def test_showallinfo_json_rx6600_has_few_readings() -> None:
    inventory = parse_rocm_smi_json(fixture("rocm_smi_showallinfo_rx6600.json"))

    assert len(inventory.gpus) == 1
    gpu = inventory.gpus[0]
    assert gpu.name == "Navi 23 [Radeon RX 6600/6600 XT/6600M]"
    assert gpu.pci_bus == "0000:0B:00.0"
    assert gpu.utilization_pct == 0.0
    assert gpu.uuid is None
    assert gpu.temp_edge_c is None and gpu.power_w is None and gpu.vram_total_bytes is None
    assert inventory.driver_version == "7.0.0-3-pve"


def test_concise_table_rocm6_four_mi300x() -> None:
    inventory = parse_rocm_smi_table(fixture("rocm_smi_concise_mi300x4.txt"))

    assert len(inventory.gpus) == 4
    assert [g.temp_junction_c for g in inventory.gpus] == [35.0, 37.0, 34.0, 38.0]
    assert [g.power_w for g in inventory.gpus] == [133.0, 131.0, 131.0, 137.0]
    assert [g.sclk_mhz for g in inventory.gpus] == [131.0, 132.0, 132.0, 131.0]
    for gpu in inventory.gpus:
        assert gpu.name == "AMD Instinct MI300X"
        assert gpu.temp_edge_c is None  # the header labels the column (Junction)
        assert gpu.power_cap_w == 750.0
        assert gpu.mclk_mhz == 900.0
        assert gpu.utilization_pct == 0.0


def test_concise_table_rocm5_mi250x_secondary_dies() -> None:
    inventory = parse_rocm_smi_table(fixture("rocm_smi_concise_mi250x_rocm5.txt"))

    assert len(inventory.gpus) == 8
    edge = [g.temp_edge_c for g in inventory.gpus]
    assert edge == [47.0, 46.0, 46.0, 46.0, 47.0, 46.0, 45.0, 39.0]
    assert [g.power_w for g in inventory.gpus] == [91.0, None, 97.0, None, 89.0, None, 95.0, None]
    # Secondary GCDs print "0.0W" as their cap: that is "no cap", not zero watts.
    assert [g.power_cap_w for g in inventory.gpus] == [560.0, None] * 4
    assert all(g.sclk_mhz == 800.0 and g.mclk_mhz == 1600.0 for g in inventory.gpus)
    assert all(g.name is None for g in inventory.gpus)


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("rocm_smi_showallinfo_mi100x4.json", 4),
        ("rocm_smi_showallinfo_rx6600.json", 1),
        ("rocm_smi_concise_mi300x4.txt", 4),
        ("rocm_smi_concise_mi250x_rocm5.txt", 8),
    ],
)
def test_parse_rocm_smi_picks_the_right_form(name: str, gpus: int) -> None:
    assert len(parse_rocm_smi(fixture(name)).gpus) == gpus


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "no output"),
        ('{"system": {"Driver version": "6.3.6"}}', "no 'cardN' entries"),
        ('["card0"]', "expected a JSON object"),
        ('{"card0": "hot"}', "'card0' is str"),
        ('{"card0": {"Temperature (Sensor edge) (C)": "hot"}}', "temperature (sensor edge)"),
        ('{"card0": {"sclk clock speed:": "fast"}}', "sclk clock speed"),
        ("ROCm System Management Interface\nERROR: GPU[0] not found", "no Concise Info header"),
        ("GPU  Temp  AvgPwr  SCLK  MCLK  Fan  Perf  PwrCap  VRAM%  GPU%\n", "no GPU rows"),
        ("GPU  Temp  SCLK  MCLK\n0    47.0c  800Mhz", "expected 8 or more"),
        (
            "GPU  Temp   AvgPwr  SCLK    MCLK     Fan  Perf  PwrCap  VRAM%  GPU%\n"
            "0    47.0c  91.0W   800Mhz  1600Mhz  0%   auto  lots    0%   0%",
            "PwrCap",
        ),
    ],
)
def test_malformed_input_raises_tool_output_error(raw: str, says: str) -> None:
    with pytest.raises(ToolOutputError) as caught:
        parse_rocm_smi(raw)

    assert caught.value.tool == "rocm-smi"
    assert says in str(caught.value)
