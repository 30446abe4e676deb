"""probe_gpus: finding, running and parsing tools, with fake tools on PATH.

The fake tools are tiny Python scripts that print the recorded real outputs,
so these tests exercise the real subprocess and timeout paths on any machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from libs.gpu import probe_gpus

FIXTURES = Path(__file__).parent / "fixtures"
# Printed by `amd-smi version` in ROCm/legacy-rocm-build issue #4759.
AMD_SMI_VERSION = (
    "AMDSMI Tool: 25.4.2+aca1101 | AMDSMI Library version: 25.4.0 | ROCm version: 6.4.1 | "
    "amdgpu version: 6.10.5 | amd_hsmp version: N/A"
)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An otherwise empty PATH that tests put fake tools into."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


def fake_tool(bin_dir: Path, name: str, body: str) -> None:
    """A Python script named like the tool; ``body`` sees ``args`` (argv[1:])."""
    script = bin_dir / name
    script.write_text(
        f"#!{sys.executable}\nimport sys, time\nargs = sys.argv[1:]\n{body}\n", encoding="utf-8"
    )
    script.chmod(0o755)


def prints(name: str) -> str:
    return f"sys.stdout.write(open({str(FIXTURES / name)!r}, encoding='utf-8').read())"


def test_no_tool_on_path_is_unavailable_not_an_exception(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "")

    result = probe_gpus(sysfs_root=tmp_path)

    assert result.status == "unavailable"
    assert result.inventory is None
    assert result.reason is not None
    for tool in ("amd-smi", "rocm-smi", "nvidia-smi"):
        assert f"{tool}: not found on PATH" in result.reason
    assert "sysfs: no amdgpu devices" in result.reason


def test_amd_smi_metric_and_static_are_merged(bin_dir: Path, tmp_path: Path) -> None:
    fake_tool(
        bin_dir,
        "amd-smi",
        f"""
if args[:1] == ['metric']:
    {prints("amd_smi_metric_rx6600.json")}
elif args[:1] == ['static']:
    {prints("amd_smi_static_rx6600.json")}
else:
    print({AMD_SMI_VERSION!r})
""",
    )

    result = probe_gpus(sysfs_root=tmp_path)

    assert result.status == "ok" and result.tool == "amd-smi"
    assert result.inventory is not None
    assert result.inventory.tool_version == "25.4.2+aca1101"
    assert result.inventory.driver_version == "7.0.0-3-pve"
    gpu = result.inventory.gpus[0]
    assert gpu.name == "Navi 23 [Radeon RX 6600/6600 XT"  # from static
    assert gpu.temp_edge_c == 36.0  # from metric
    assert gpu.power_cap_w == 100.0


def test_timeout_is_unavailable_with_the_reason(bin_dir: Path, tmp_path: Path) -> None:
    fake_tool(bin_dir, "nvidia-smi", "time.sleep(30)")

    result = probe_gpus(("nvidia-smi",), timeout_s=0.3, sysfs_root=tmp_path)

    assert result.status == "unavailable"
    assert result.reason is not None
    assert "nvidia-smi" in result.reason and "timed out after 0.3s" in result.reason


def test_rocm_smi_falls_back_to_the_concise_table(bin_dir: Path, tmp_path: Path) -> None:
    fake_tool(
        bin_dir,
        "rocm-smi",
        f"""
if '--json' in args:
    sys.stderr.write('unrecognized arguments: --json\\n')
    sys.exit(2)
{prints("rocm_smi_concise_mi300x4.txt")}
""",
    )

    result = probe_gpus(("rocm-smi",), sysfs_root=tmp_path)

    assert result.status == "ok"
    assert result.inventory is not None
    assert [g.temp_junction_c for g in result.inventory.gpus] == [35.0, 37.0, 34.0, 38.0]


def test_unparsable_output_is_an_error_and_the_next_tool_is_tried(
    bin_dir: Path, tmp_path: Path
) -> None:
    fake_tool(bin_dir, "nvidia-smi", "print('this is not csv from a gpu, just words')")
    fake_tool(bin_dir, "rocm-smi", prints("rocm_smi_showallinfo_mi100x4.json"))

    result = probe_gpus(("nvidia-smi", "rocm-smi"), sysfs_root=tmp_path)

    assert result.status == "ok" and result.tool == "rocm-smi"
    assert result.inventory is not None and len(result.inventory.gpus) == 4
    assert result.attempts[0].startswith("nvidia-smi: row 1 has")
    assert result.attempts[1] == "rocm-smi: ok, 4 GPU(s)"


def test_failing_tool_is_an_error_with_exit_code_and_message(bin_dir: Path, tmp_path: Path) -> None:
    fake_tool(
        bin_dir,
        "nvidia-smi",
        'print("NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver.")'
        "\nsys.exit(9)",
    )

    result = probe_gpus(("nvidia-smi",), sysfs_root=tmp_path)

    assert result.status == "error"
    assert result.reason is not None
    assert "exited with 9" in result.reason and "NVIDIA driver" in result.reason


def test_sysfs_is_the_last_resort(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", "")
    device = tmp_path / "sys" / "class" / "drm" / "card0" / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x1002\n")
    (device / "gpu_busy_percent").write_text("12\n")

    result = probe_gpus(sysfs_root=tmp_path)

    assert result.status == "ok" and result.tool == "sysfs"
    assert result.inventory is not None
    assert result.inventory.gpus[0].utilization_pct == 12.0


def test_sysfs_fallback_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    result = probe_gpus(sysfs_root=None)

    assert result.status == "unavailable"
    assert all("sysfs" not in line for line in result.attempts)


def test_a_tool_without_a_parser_is_skipped(tmp_path: Path) -> None:
    result = probe_gpus(("xpu-smi",), sysfs_root=None, which=lambda name: f"/usr/bin/{name}")

    assert result.status == "unavailable"
    assert result.attempts == ("xpu-smi: no parser for this tool",)
