"""GPU health checks over recorded real tool outputs (tests/gpu/fixtures), and
the quick level's probe when no tool is installed (this machine): every GPU
check unavailable, nothing raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.gpu import GpuInventory, ProbeResult, parse_nvidia_smi_xml, parse_rocm_smi
from services.bench import probes
from services.bench.config import GpuLimits
from services.bench.gpu_health import GPU_KINDS, gpu_checks, gpu_figures

FIXTURES = Path(__file__).parents[1] / "gpu" / "fixtures"


def probe_of(inventory: GpuInventory) -> ProbeResult:
    return ProbeResult(status="ok", tool=inventory.tool, inventory=inventory)


def statuses(probe: ProbeResult, **kw: object) -> dict[str, str]:
    checks = gpu_checks(probe, expected=kw.pop("expected", None),  # type: ignore[arg-type]
                        limits=GpuLimits.model_validate(kw))
    return {c.name: c.status for c in checks}


def mi100() -> ProbeResult:
    return probe_of(parse_rocm_smi((FIXTURES / "rocm_smi_showallinfo_mi100x4.json").read_text()))


def test_healthy_mi100_node() -> None:
    assert statuses(mi100(), expected=4) == {
        "gpu_count": "ok", "gpu_temperature": "ok", "gpu_ecc": "unavailable",
        "gpu_pcie": "ok", "gpu_xgmi": "unavailable", "gpu_power": "ok", "gpu_vram": "ok"}


def test_limits_turn_readings_into_failures() -> None:
    probe = mi100()
    assert statuses(probe, expected=8)["gpu_count"] == "failed"
    assert statuses(probe, max_temp_c=50)["gpu_temperature"] == "failed"
    assert statuses(probe, min_pcie_width=32)["gpu_pcie"] == "failed"
    assert statuses(probe, min_pcie_speed_gts=32)["gpu_pcie"] == "failed"
    assert statuses(probe, max_power_over_cap=0.1)["gpu_power"] == "failed"
    [hot] = [c for c in gpu_checks(probe, expected=None, limits=GpuLimits(max_temp_c=57))
             if c.name == "gpu_temperature"]
    assert hot.detail.startswith("GPU 1: 58 °C > 57 °C")


def test_ecc_counts_from_nvidia_smi() -> None:
    xml = (FIXTURES / "nvidia_smi_q_x_a100_sxm4.xml").read_text()
    probe = probe_of(parse_nvidia_smi_xml(xml))
    assert statuses(probe)["gpu_ecc"] == "ok"
    bad = probe.inventory.model_copy(update={"gpus": tuple(  # type: ignore[union-attr]
        g.model_copy(update={"ecc_uncorrectable": 3}) for g in probe.inventory.gpus)})  # type: ignore[union-attr]
    assert statuses(probe_of(bad))["gpu_ecc"] == "failed"
    assert statuses(probe_of(bad), max_ecc_uncorrectable=None)["gpu_ecc"] == "ok"


def test_figures_carry_units() -> None:
    figures = {f.name: (f.value, f.unit) for f in gpu_figures(mi100())}
    assert figures["gpu_count"] == (4, "devices")
    assert figures["gpu_temp_max_c"][1] == "°C"
    assert figures["gpu_pcie_width_min"] == (16, "lanes")
    assert figures["gpu_vram_total_bytes"] == (4 * 34342961152, "bytes")
    assert all(unit for _, unit in figures.values())


def test_no_tool_means_unavailable_never_a_crash(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no amd-smi, rocm-smi or nvidia-smi
    checks, figures, probe = probes.gpu_readings(expected=8, limits=GpuLimits())
    assert probe.status == "unavailable" and figures == []
    assert [c.name for c in checks] == list(GPU_KINDS)
    assert {c.status for c in checks} == {"unavailable"}
    assert "amd-smi: not found on PATH" in checks[0].detail
    check = probes.run_check("gpu_count", expected=8, limits=GpuLimits(), timeout_s=5)
    assert check.status == "unavailable"


def test_a_tool_that_prints_nonsense_is_unavailable() -> None:
    probe = ProbeResult(status="error", reason="nvidia-smi: output is not CSV")
    checks = gpu_checks(probe, expected=1, limits=GpuLimits())
    assert {c.status for c in checks} == {"unavailable"}
    assert "unusable" in checks[0].detail
