"""The pure parts of bench/gpu_check.sh: which published peak a device has,
each figure as a share of it, and the report step over recorded step files.
The script itself is checked for syntax and for a clean refusal without a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from libs.events import Figure
from services.bench import gpu_check
from services.bench.config import BenchConfig
from services.bench.fleet import judge_node
from services.bench.gpu_peaks import DEFAULT_FLOORS, PEAKS, lookup, peak_floors, shares, table
from tests.helpers import ROOT

NAMES = [
    ("AMD Instinct MI355X", "MI355X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI250X/MI250", "MI250X"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA A100-PCIE-40GB", None),
    ("NVIDIA GeForce RTX 2080", None),
    ("AMD Radeon RX 6600", None),
]


@pytest.mark.parametrize(("name", "model"), NAMES)
def test_lookup(name: str, model: str | None) -> None:
    peaks = lookup(name)
    assert (peaks.model if peaks else None) == model


def test_the_table_is_dense_per_device_and_ordered_sensibly() -> None:
    for peaks in PEAKS.values():
        assert peaks.tflops["bf16"] == peaks.tflops["fp16"] > peaks.tflops["fp32"] > 0
        assert peaks.link_gbps and peaks.link_gbps > 0
    assert PEAKS["MI300X"].tflops["bf16"] == 1307.4  # dense, not the 2614.9 sparse figure
    assert PEAKS["H100 SXM"].tflops["bf16"] == 989.4  # dense, not 1,979 with sparsity
    assert PEAKS["MI250X"].tflops["bf16"] * 2 == 383.0  # one GCD is one torch device
    assert PEAKS["MI355X"].tflops["bf16"] == 2516.6  # AMD's "2.5 PFLOPS", dense
    for peaks in PEAKS.values():  # 8-bit runs twice the 16-bit rate where a part has it
        ratio = peaks.tflops["int8"] / peaks.tflops["bf16"]
        assert ratio == pytest.approx(1.0) or ratio == pytest.approx(2.0, rel=2e-3)
        assert peaks.tflops.get("fp8", peaks.tflops["int8"]) == peaks.tflops["int8"]
        assert peaks.hbm_gbps and peaks.hbm_gbps > 1000
    assert "fp8" not in PEAKS["A100"].tflops and "fp8" not in PEAKS["MI250X"].tflops


def test_floors_are_a_share_of_the_models_peak_at_large_sizes_only() -> None:
    figures = ["gemm_bf16_4096_tflops", "gemm_bf16_8192_tflops", "gemm_fp8_8192_tflops",
               "gemm_int8_16384_tops", "membw_copy_gbps", "train_tokens_per_s"]
    shares_ = {**DEFAULT_FLOORS, "int8": 0.25, "fp8": 0.25}
    floors = peak_floors(figures, lookup("AMD Instinct MI300X"), shares_)
    assert floors == {"gemm_bf16_8192_tflops": round(0.35 * 1307.4, 3),
                      "gemm_fp8_8192_tflops": round(0.25 * 2614.9, 3),
                      "gemm_int8_16384_tops": round(0.25 * 2614.9, 3),
                      "membw_copy_gbps": 0.5 * 5300}
    assert peak_floors(figures, lookup("AMD Radeon RX 6600"), shares_) == {}
    assert "gemm_fp8_8192_tflops" not in peak_floors(figures, lookup("NVIDIA A100-SXM4-80GB"),
                                                      shares_)
    # Each GPU's figure has its floor too: the reason then names the GPU.
    assert peak_floors(["gpu5_gemm_bf16_8192_tflops", "gpu5_membw_triad_gbps"],
                       lookup("AMD Instinct MI300X"), shares_) == {
        "gpu5_gemm_bf16_8192_tflops": round(0.35 * 1307.4, 3),
        "gpu5_membw_triad_gbps": 0.5 * 5300}
    # By default no 8-bit floor (their torch kernels vary too much by release).
    assert set(peak_floors(figures, lookup("AMD Instinct MI300X"), DEFAULT_FLOORS)) == {
        "gemm_bf16_8192_tflops", "membw_copy_gbps"}


def test_a_configured_floor_stands_over_the_peak_share_and_shares_are_validated() -> None:
    config = BenchConfig.model_validate({"peak_floors": {"bf16": 0.5},
                                         "floors": {"MI300X": {"gemm_bf16_8192_tflops": 800}}})
    names = ["gemm_bf16_8192_tflops", "gemm_fp16_8192_tflops"]
    assert config.floors_of("AMD Instinct MI300X", names) == {"gemm_bf16_8192_tflops": 800}
    assert BenchConfig().floors_of("NVIDIA H100 80GB HBM3", names) == {
        "gemm_bf16_8192_tflops": round(0.35 * 989.4, 3),
        "gemm_fp16_8192_tflops": round(0.35 * 989.4, 3)}
    assert BenchConfig.model_validate({"peak_floors": {}}).floors_of(
        "AMD Instinct MI300X", names) == {}
    with pytest.raises(ValueError, match="at most 1"):
        BenchConfig.model_validate({"peak_floors": {"bf16": 1.5}})
    with pytest.raises(ValueError):
        BenchConfig.model_validate({"peak_floors": {"bf17": 0.5}})


def test_a_node_below_its_peak_floor_fails_though_its_whole_fleet_is_as_slow() -> None:
    """Three throttled MI300X nodes and a fourth just as slow: the fleet sees
    nothing wrong, the floor does."""
    config = BenchConfig()
    slow = {"gemm_bf16_8192_tflops": 300.0}
    peers = {f"n{i}": slow for i in range(3)}
    floors = config.floors_of("AMD Instinct MI300X", list(slow))
    judged = judge_node([("gemm_bf16_8192_tflops", 300.0, "TFLOPS")], peers,
                        policy=config.fleet, floors=floors)
    assert judged.outcome == "failed" and "below the floor" in judged.reason
    healthy = judge_node([("gemm_bf16_8192_tflops", 650.0, "TFLOPS")],
                         {f"n{i}": {"gemm_bf16_8192_tflops": 650.0} for i in range(3)},
                         policy=config.fleet, floors=floors)
    assert healthy.outcome == "healthy"


def test_shares() -> None:
    rows = shares([("gemm_bf16_8192_tflops", 653.7, "TFLOPS"),
                   ("gemm_fp32_8192_tflops", 50.0, "TFLOPS"),
                   ("allreduce_512MiB_busbw_gbps", 336.0, "GB/s"),
                   ("membw_copy_gbps", 4000.0, "GB/s")], lookup("AMD Instinct MI300X"))
    assert [round(r.share, 3) if r.share else None for r in rows] == [0.5, 0.306, 0.75, 0.755]
    unknown = shares([("gemm_bf16_8192_tflops", 1.0, "TFLOPS")], None)
    assert unknown[0].peak is None and unknown[0].share is None
    text = table(rows)
    assert "50.0%" in text and "75.0%" in text and text.count("\n") == 4


H200_RUN = Path(__file__).parent / "fixtures" / "gpu_check_h200"


def test_report_on_the_step_files_of_a_real_h200_run(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # level.json and health.json as bench/gpu_check.sh wrote them on a lent
    # one-GPU H200 machine (2026-12-04; see the folder's README.md).
    assert gpu_check.main(["report", str(H200_RUN)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "NVIDIA H200 -> H200"
    header, gpu0, node, share = out[1:5]
    assert header.split()[:4] == ["bf16", "TFLOPS", "fp16", "TFLOPS"]
    assert gpu0.split()[:2] == ["GPU", "0"] and node.split()[0] == "node"
    assert share.split()[:4] == ["%", "of", "peak", "68.4%"]
    assert "floors: 5 of 5 held" in out
    assert "standard level: healthy: all checks passed" in out
    assert any(line.split() == ["skipped", "rdma_ports:", "not", "applicable:", "no",
                                "InfiniBand/RoCE", "device", "(/sys/class/infiniband)"]
               for line in out)
    last = json.loads(out[-1])
    assert (last["name"], last["model"], last["outcome"]) == ("gpu_check", "H200", "healthy")
    assert last["failed_checks"] == [] and last["below_floor"] == 0
    ratios = {f["name"]: f["ratio"] for f in last["figures"]}
    assert ratios["gemm_bf16_8192_tflops"] == 0.6844
    assert ratios["gemm_int8_8192_tops"] == 0.4607
    assert ratios["membw_triad_gbps"] == 0.9074

    # The same run with its bf16 GEMM at a third of peak: under the default
    # floor (35%), so the report names it and fails.
    level = json.loads((H200_RUN / "level.json").read_text())
    for f in level["figures"]:
        if f["name"].endswith("gemm_bf16_8192_tflops"):
            f["value"] = 330.0
    (tmp_path / "level.json").write_text(json.dumps(level))
    assert gpu_check.main(["report", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "problem: gemm_bf16_8192_tflops 330 TFLOPS is below its floor 346.1" in out
    assert gpu_check.main(["report", str(tmp_path / "empty")]) == 1


def test_gpu_table_rows_per_gpu_and_the_weakest_as_the_node() -> None:
    figures = [Figure(name=f"gpu{i}_{name}", value=value * (1 - 0.1 * i), unit=unit)
               for i in range(2)
               for name, value, unit in [("gemm_bf16_4096_tflops", 700.0, "TFLOPS"),
                                         ("gemm_bf16_8192_tflops", 800.0, "TFLOPS"),
                                         ("membw_copy_gbps", 3000.0, "GB/s")]]
    figures += [Figure(name="gemm_bf16_8192_tflops", value=720.0, unit="TFLOPS"),
                Figure(name="membw_copy_gbps", value=2700.0, unit="GB/s")]
    rows = gpu_check.gpu_table(figures, lookup("NVIDIA H100 80GB HBM3")).splitlines()
    assert rows[0].split() == ["bf16", "TFLOPS", "copy", "GB/s"]  # the largest GEMM only
    assert rows[1].split() == ["GPU", "0", "800.0", "3000.0"]
    assert rows[2].split() == ["GPU", "1", "720.0", "2700.0"]
    assert rows[3].split() == ["node", "720.0", "2700.0"]
    assert rows[4].split() == ["%", "of", "peak", "72.8%", "80.6%"]
    assert gpu_check.gpu_table([], None) == "no per-GPU figures"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses_and_refuses_cleanly_without_a_gpu() -> None:
    script = ROOT / "bench" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would measure it")
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and "torch sees no GPU" in done.stderr
