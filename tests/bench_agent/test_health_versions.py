"""Driver-version probe: parsers on recorded outputs, drift against a fleet,
and the probe on a fake tree and runner and on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bench.health import versions
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable

FIX = Path(__file__).parent / "fixtures" / "health"
GPU_FIX = Path(__file__).parents[1] / "gpu" / "fixtures"
A10G = (FIX / "nvidia_smi_q_x_a10g.xml").read_text()
A100 = (GPU_FIX / "nvidia_smi_q_x_a100_sxm4.xml").read_text()
H200 = (GPU_FIX / "nvidia_smi_q_x_h200.xml").read_text()
H200_PROC = (FIX / "proc_driver_nvidia_version_h200.txt").read_text()
# The `amd-smi version` line quoted in tests/gpu/fixtures/README.md, from
# https://github.com/ROCm/legacy-rocm-build/issues/4759 (only the start is quoted there).
AMD_SMI_VERSION_PREFIX = "AMDSMI Tool: 25.4.2+aca1101 | "
# The dmesg line NVIDIA's driver prints when loading, from
# https://github.com/NVIDIA/NVSentinel/issues/155 (fixtures/health/kmsg_nvidia_fallen_off_bus.txt).
NVRM_LOADING = (FIX / "kmsg_nvidia_fallen_off_bus.txt").read_text().splitlines()[-1]


def test_nvidia_xml_versions():
    assert versions.parse_nvidia_xml_versions(A10G) == {"nvidia": "515.105.01", "cuda": "11.7"}
    assert versions.parse_nvidia_xml_versions(A100) == {"nvidia": "535.54.03", "cuda": "12.2"}
    assert versions.parse_nvidia_xml_versions(H200) == {"nvidia": "580.159.04", "cuda": "13.0"}
    with pytest.raises(ValueError):
        versions.parse_nvidia_xml_versions("NVIDIA-SMI has failed")


def test_nvrm_version_line():
    # /proc/driver/nvidia/version starts with "NVRM version: NVIDIA UNIX ... Kernel Module  <v>";
    # the load message carries the same "Kernel Module for x86_64  <v>" phrase.
    assert versions.parse_proc_nvidia_version(NVRM_LOADING) == "570.158.01"
    assert versions.parse_proc_nvidia_version("garbage") is None
    assert versions.parse_proc_nvidia_version(H200_PROC) == "580.159.04"


def test_amd_smi_version_without_rocm_is_none():
    assert versions.parse_amd_smi_version(AMD_SMI_VERSION_PREFIX) is None


def test_drift_against_fleet_majority():
    fleet = [{"rocm": "6.3.1", "amdgpu": "6.10.5"}] * 7 + [{"rocm": "6.2.0", "amdgpu": "6.10.5"}]
    assert versions.drift({"rocm": "6.2.0", "amdgpu": "6.10.5"}, fleet) == [
        "rocm 6.2.0, fleet majority 6.3.1 (7 of 8 nodes)"
    ]
    assert versions.drift({"rocm": "6.3.1"}, fleet) == []
    tie = [{"nvidia": "550.1"}, {"nvidia": "535.2"}]
    assert versions.drift({"nvidia": "550.1"}, tie) == [
        "nvidia 550.1, fleet majority 535.2 (1 of 2 nodes)"
    ]
    assert versions.drift({"cuda": "12.4"}, fleet) == []  # the fleet does not report CUDA


class Runner:
    def __init__(self, answers):
        self.answers = answers

    def __call__(self, argv, timeout_s):
        answer = self.answers.get(argv[0])
        if answer is None:
            raise ToolUnavailable(f"{argv[0]}: not installed")
        if isinstance(answer, Exception):
            raise answer
        return answer if isinstance(answer, ToolOutput) else ToolOutput(0, answer, "")


def amd_tree(tmp_path: Path, amdgpu: str | None = "6.10.5", rocm: str | None = "6.3.1") -> Path:
    (tmp_path / "sys/module/amdgpu").mkdir(parents=True)
    if amdgpu:
        (tmp_path / "sys/module/amdgpu/version").write_text(amdgpu + "\n")
    if rocm:
        (tmp_path / "opt/rocm/.info").mkdir(parents=True)
        (tmp_path / "opt/rocm/.info/version").write_text(rocm + "\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    return tmp_path


def test_amd_ok_states_versions(tmp_path):
    found = versions.probe(ProbeContext(root=amd_tree(tmp_path), run=Runner({})))
    assert found.status == "ok" and found.detail == "amdgpu 6.10.5, rocm 6.3.1"


def test_in_kernel_amdgpu_names_the_kernel(tmp_path):
    found = versions.probe(ProbeContext(root=amd_tree(tmp_path, amdgpu=None), run=Runner({})))
    assert "amdgpu kernel 6.8.0-45-generic" in found.detail


def test_failed_on_expected_mismatch(tmp_path):
    ctx = ProbeContext(
        root=amd_tree(tmp_path), run=Runner({}), options={"expected": {"rocm": "6.4.0"}}
    )
    found = versions.probe(ctx)
    assert found.status == "failed" and "rocm 6.3.1 (expected 6.4.0)" in found.detail


def test_nvidia_from_proc_and_smi(tmp_path):
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(NVRM_LOADING + "\n")
    found = versions.probe(
        ProbeContext(
            root=tmp_path,
            run=Runner({"nvidia-smi": A10G}),
            options={"expected": {"nvidia": "570.158.01", "cuda": "11.7"}},
        )
    )
    assert found.status == "ok" and found.detail == "cuda 11.7, nvidia 570.158.01"


def test_not_applicable_without_driver(tmp_path):
    assert versions.probe(ProbeContext(root=tmp_path, run=Runner({}))).status == "not_applicable"


def test_tool_missing_timeout_garbage(tmp_path):
    root = amd_tree(tmp_path, rocm=None)
    found = versions.probe(ProbeContext(root=root, run=Runner({})))
    assert found.status == "ok" and "not read: rocm (amd-smi: not installed)" in found.detail
    slow = Runner({"amd-smi": ToolUnavailable("amd-smi: no answer within 30 s")})
    assert "no answer" in versions.probe(ProbeContext(root=root, run=slow)).detail
    (tmp_path / "n/proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "n/proc/driver/nvidia/version").write_text("garbage\n")
    found = versions.probe(ProbeContext(root=tmp_path / "n", run=Runner({"nvidia-smi": "garbage"})))
    assert found.status == "unknown" and "not XML" in found.detail


def test_on_this_machine():
    assert versions.probe(ProbeContext()).status != "failed"


def test_a_rollout_half_done_is_no_majority_to_drift_from():
    half = [{"rocm": "6.3.1"}] * 4 + [{"rocm": "6.4.0"}] * 4
    assert versions.drift({"rocm": "6.4.0"}, half, min_share=0.5) == []
    most = [{"rocm": "6.3.1"}] * 5 + [{"rocm": "6.4.0"}] * 3
    assert versions.drift({"rocm": "6.4.0"}, most, min_share=0.5) == [
        "rocm 6.4.0, fleet majority 6.3.1 (5 of 8 nodes)"
    ]


def test_stated_versions_read_back_what_the_probe_states(tmp_path):
    kernel = versions.probe(ProbeContext(root=amd_tree(tmp_path, amdgpu=None, rocm=None),
                                         run=Runner({})))
    assert versions.parse_stated(kernel.detail) == {"amdgpu": "kernel 6.8.0-45-generic"}
    assert "not read: rocm" in kernel.detail  # the part after "; " is no version
    both = {"nvidia": "570.158.01", "cuda": "11.7"}
    assert versions.parse_stated(versions.state(both)) == both
    assert versions.parse_stated("no version read; not read: cuda (x)") == {}


def test_the_bench_run_states_versions_and_never_fails(tmp_path):
    check = versions.version_check(ProbeContext(root=amd_tree(tmp_path / "a"), run=Runner({})))
    assert (check.name, check.status, check.detail) == (
        "driver_versions", "ok", "amdgpu 6.10.5, rocm 6.3.1")
    (tmp_path / "n/proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "n/proc/driver/nvidia/version").write_text("garbage\n")
    unread = versions.version_check(ProbeContext(root=tmp_path / "n", run=Runner({})))
    assert unread.status == "skipped" and unread.detail.startswith("no version read; not read:")
    here = versions.version_check(ProbeContext())
    assert here.status == "skipped" and "no GPU driver loaded" in here.detail
