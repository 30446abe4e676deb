"""amd-smi JSON parsing, checked against real recorded outputs (see fixtures/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libs.gpu import GpuInventory, ToolOutputError, parse_amd_smi_json, parse_amd_smi_version

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1024**2


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_metric_rx6600_legacy_list_form() -> None:
    inventory = parse_amd_smi_json(fixture("amd_smi_metric_rx6600.json"))

    assert inventory.tool == "amd-smi"
    assert len(inventory.gpus) == 1
    gpu = inventory.gpus[0]
    assert gpu.index == 0
    assert gpu.utilization_pct == 1.0
    assert (gpu.temp_edge_c, gpu.temp_junction_c, gpu.temp_memory_c) == (36.0, 37.0, 32.0)
    assert gpu.power_w == 6.0
    assert gpu.sclk_mhz == 800.0
    assert gpu.mclk_mhz == 541.0
    assert gpu.vram_total_bytes == 8176 * MIB
    assert gpu.vram_used_bytes == 202 * MIB
    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (0, 0)
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (16.0, 8)
    assert gpu.xgmi_errors is None  # "N/A" on a consumer card
    assert gpu.name is None  # names live in `static`, not `metric`


def test_static_rx6600_names_caps_and_driver() -> None:
    inventory = parse_amd_smi_json(fixture("amd_smi_static_rx6600.json"))

    gpu = inventory.gpus[0]
    assert gpu.name == "Navi 23 [Radeon RX 6600/6600 XT"
    assert gpu.pci_bus == "0000:0b:00.0"
    assert gpu.power_cap_w == 100.0
    assert gpu.vram_total_bytes == 8176 * MIB
    assert gpu.serial is None  # asic_serial and product_serial are "N/A"
    assert inventory.driver_version == "7.0.0-3-pve"


def test_metric_merged_with_static_gives_the_whole_picture() -> None:
    metric = parse_amd_smi_json(fixture("amd_smi_metric_rx6600.json"))
    static = parse_amd_smi_json(fixture("amd_smi_static_rx6600.json"))

    merged = metric.merged_with(static)

    gpu = merged.gpus[0]
    assert gpu.name == "Navi 23 [Radeon RX 6600/6600 XT"
    assert gpu.power_w == 6.0 and gpu.power_cap_w == 100.0
    assert gpu.temp_edge_c == 36.0
    assert merged.driver_version == "7.0.0-3-pve"


def test_static_mi210_gpu_data_wrapper_form() -> None:
    inventory = parse_amd_smi_json(fixture("amd_smi_static_mi210.json"))

    assert len(inventory.gpus) == 1
    gpu = inventory.gpus[0]
    assert gpu.name == "AMD Instinct MI210"
    assert gpu.vram_total_bytes == 65520 * MIB == 68_702_699_520
    assert gpu.power_cap_w == 300.0
    # static clocks give the current DPM level: sys "Level 1" and mem "Level 3".
    assert gpu.sclk_mhz == 800.0
    assert gpu.mclk_mhz == 1600.0
    assert inventory.driver_version is not None
    assert inventory.driver_version.startswith("Linuxversion6.14.0-24-generic")


def test_warning_lines_before_the_json_are_skipped() -> None:
    noisy = "WARNING: User is missing the following required groups: render\n" + fixture(
        "amd_smi_metric_rx6600.json"
    )

    assert parse_amd_smi_json(noisy).gpus[0].temp_edge_c == 36.0


def test_version_line() -> None:
    # Printed by `amd-smi version` in ROCm/legacy-rocm-build issue #4759.
    line = (
        "AMDSMI Tool: 25.4.2+aca1101 | AMDSMI Library version: 25.4.0 | ROCm version: 6.4.1 | "
        "amdgpu version: 6.10.5 | amd_hsmp version: N/A"
    )
    assert parse_amd_smi_version(line) == "25.4.2+aca1101"
    assert parse_amd_smi_version("something else") is None


@pytest.mark.parametrize(
    ("status", "count"),
    [
        ("N/A", None),
        ("No errors detected", 0),
        ("Single error detected", 1),
        ("Multiple errors detected", 2),
        (3, 3),
    ],
)
def test_xgmi_status_is_mapped_to_a_count(status: object, count: int | None) -> None:
    raw = json.dumps([{"gpu": 0, "xgmi_err": status}])
    assert parse_amd_smi_json(raw).gpus[0].xgmi_errors == count


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "no output"),
        ("GPU: 0\n    USAGE:\n        GFX_ACTIVITY: 0 %", "not JSON"),
        ('{"gpu_data": 5}', "expected a list of GPUs"),
        ("[1]", "GPU entry 0 is int"),
        ('[{"usage": {}}]', "no 'gpu' index"),
        ('[{"gpu": "zero"}]', "'gpu'"),
        ('[{"gpu": 0}, {"gpu": 0}]', "appears twice"),
        (
            '[{"gpu": 0, "temperature": {"edge": {"value": "hot", "unit": "C"}}}]',
            "temperature.edge",
        ),
        ('[{"gpu": 0, "usage": {"gfx_activity": {"value": [1], "unit": "%"}}}]', "gfx_activity"),
        ('[{"gpu": 0, "mem_usage": {"used_vram": {"value": 1, "unit": "parsec"}}}]', "parsec"),
        ('[{"gpu": 0, "xgmi_err": "sideways"}]', "xgmi_err"),
    ],
)
def test_malformed_input_raises_tool_output_error(raw: str, says: str) -> None:
    with pytest.raises(ToolOutputError) as caught:
        parse_amd_smi_json(raw)

    assert caught.value.tool == "amd-smi"
    assert str(caught.value).startswith("amd-smi: ")
    assert says in str(caught.value)


def test_truncated_real_output_raises_not_jsondecodeerror() -> None:
    text = fixture("amd_smi_metric_rx6600.json")

    with pytest.raises(ToolOutputError, match="not JSON"):
        parse_amd_smi_json(text[: len(text) // 2])


def test_inventory_is_sorted_by_index_and_frozen() -> None:
    inventory = parse_amd_smi_json('[{"gpu": 2}, {"gpu": 0}]')

    assert [g.index for g in inventory.gpus] == [0, 2]
    assert isinstance(inventory, GpuInventory)
    with pytest.raises(ValueError):
        inventory.gpus[0].power_w = 5.0  # type: ignore[misc]
