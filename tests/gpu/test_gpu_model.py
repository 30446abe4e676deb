"""The shared model and unit helpers every parser relies on."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from libs.gpu import (
    GpuInventory,
    GpuSample,
    ToolOutputError,
    parse_amd_smi_json,
    parse_nvidia_smi_csv,
    parse_rocm_smi,
)
from libs.gpu.units import is_missing, number, pcie_gen_to_gts, to_bytes


def test_only_the_index_is_required() -> None:
    assert GpuSample(index=3).model_dump(exclude_none=True) == {"index": 3}
    with pytest.raises(ValidationError):
        GpuSample()  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        GpuSample(index=0, power_w=-1.0)


def test_hottest_counts_a_zero_reading() -> None:
    assert GpuSample(index=0, temp_edge_c=0.0).hottest_c == 0.0
    assert GpuSample(index=0, temp_edge_c=40.0, temp_junction_c=55.0).hottest_c == 55.0
    assert GpuSample(index=0).hottest_c is None


def test_merge_fills_gaps_by_index_and_keeps_own_readings() -> None:
    live = GpuInventory(
        tool="amd-smi",
        tool_version="25.4.2",
        gpus=(GpuSample(index=0, power_w=133.0, power_cap_w=700.0), GpuSample(index=1)),
    )
    static = GpuInventory(
        tool="amd-smi",
        driver_version="6.10.5",
        gpus=(
            GpuSample(index=0, name="AMD Instinct MI300X", power_cap_w=750.0),
            GpuSample(index=2, name="extra"),
        ),
    )

    merged = live.merged_with(static)

    assert [g.index for g in merged.gpus] == [0, 1, 2]
    assert merged.gpus[0].name == "AMD Instinct MI300X"
    assert merged.gpus[0].power_cap_w == 700.0  # own reading wins
    assert (merged.tool_version, merged.driver_version) == ("25.4.2", "6.10.5")


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "N/A",
        "[N/A]",
        "[Not Supported]",
        "Not Supported",
        "N/A (Secondary die)",
        "[Unknown Error]",
    ],
)
def test_every_tools_spelling_of_no_reading(value: object) -> None:
    assert is_missing(value)
    assert number(value, tool="t", field="f") is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("(300Mhz)", 300.0), ("54 %", 54.0), ("16.0GT/s", 16.0), (28.16, 28.16), ("0 W", 0.0)],
)
def test_numbers_are_taken_from_unit_strings(value: object, expected: float) -> None:
    assert number(value, tool="t", field="f") == expected


def test_non_numbers_name_the_tool_and_field() -> None:
    with pytest.raises(ToolOutputError, match=r"^t: field 'f' has non-numeric value 'hot'$"):
        number("hot", tool="t", field="f")
    with pytest.raises(ToolOutputError, match="boolean"):
        number(True, tool="t", field="f")


def test_memory_units_and_pcie_generations() -> None:
    assert to_bytes(8176.0, "MB", tool="t", field="f") == 8176 * 1024**2
    assert to_bytes(2.0, "GiB", tool="t", field="f") == 2 * 1024**3
    assert to_bytes(None, "MiB", tool="t", field="f") is None
    assert [pcie_gen_to_gts(g) for g in (1, 3, 4, 5, 9, None)] == [2.5, 8.0, 16.0, 32.0, None, None]


@pytest.mark.parametrize(
    ("parse", "raw", "tool"),
    [
        (parse_amd_smi_json, '[{"gpu": 0, "power": {"socket_power": {"value": -5}}}]', "amd-smi"),
        (parse_rocm_smi, '{"card0": {"GPU use (%)": "-3"}}', "rocm-smi"),
        (
            lambda raw: parse_nvidia_smi_csv(raw, ["index", "utilization.gpu"]),
            "0, -1",
            "nvidia-smi",
        ),
    ],
)
def test_values_the_model_rejects_become_tool_output_errors(
    parse: Callable[[str], object], raw: str, tool: str
) -> None:
    with pytest.raises(ToolOutputError, match=rf"^{tool}: GPU 0: ") as caught:
        parse(raw)

    assert caught.value.tool == tool
