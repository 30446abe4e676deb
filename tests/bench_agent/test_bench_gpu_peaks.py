"""The pure parts of bench/gpu_check.sh: which published peak a device has,
each figure as a share of it, and the report step over recorded step files.
The script itself is checked for syntax and for a clean refusal without a GPU."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from services.bench import gpu_check
from services.bench.gpu_peaks import PEAKS, lookup, shares, table
from tests.helpers import ROOT

NAMES = [
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


def test_shares() -> None:
    rows = shares([("gemm_bf16_8192_tflops", 653.7, "TFLOPS"),
                   ("gemm_fp32_8192_tflops", 50.0, "TFLOPS"),
                   ("allreduce_512MiB_busbw_gbps", 336.0, "GB/s"),
                   ("membw_copy_gbps", 4000.0, "GB/s")], lookup("AMD Instinct MI300X"))
    assert [round(r.share, 3) if r.share else None for r in rows] == [0.5, 0.306, 0.75, None]
    unknown = shares([("gemm_bf16_8192_tflops", 1.0, "TFLOPS")], None)
    assert unknown[0].peak is None and unknown[0].share is None
    text = table(rows)
    assert "50.0%" in text and "75.0%" in text and text.count("\n") == 4


def test_report_step_reads_the_step_files(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "gemm.json").write_text(json.dumps({
        "device": "NVIDIA H100 80GB HBM3", "kind": "cuda", "problems": [],
        "figures": [{"name": "gemm_bf16_8192_tflops", "value": 742.05, "unit": "TFLOPS"}]}))
    (tmp_path / "collectives.json").write_text(json.dumps({
        "device": "NVIDIA H100 80GB HBM3", "ranks": 8,
        "figures": [{"name": "allreduce_512MiB_busbw_gbps", "value": 360.0, "unit": "GB/s"}]}))
    assert gpu_check.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "NVIDIA H100 80GB HBM3 -> H100 SXM"
    last = json.loads(out[-1])
    assert last["name"] == "gpu_check" and last["model"] == "H100 SXM"
    ratios = {f["name"]: f["ratio"] for f in last["figures"]}
    assert ratios == {"allreduce_512MiB_busbw_gbps": 0.8, "gemm_bf16_8192_tflops": 0.75}
    assert gpu_check.main(["report", str(tmp_path / "empty")]) == 1


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
