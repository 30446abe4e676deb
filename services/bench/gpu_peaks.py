"""Published peak figures of the GPUs this project targets, per torch device,
and measured figures as a share of them (pure).

A GEMM at 70% of peak is healthy on one model and a bad node on another only
if you know the peak: ``bench/gpu_check.sh`` prints every figure as a share
of the vendor's number. Peaks are dense (no structured sparsity), per device
torch sees (an MI250X package is two devices, one per GCD), and the link
figure is the per-direction bandwidth of one device's GPU-to-GPU links, which
is what an nccl-tests all-reduce bus bandwidth approaches.

Sources (vendor data sheets / product pages):
- MI300X: AMD Instinct MI300X data sheet — FP16/BF16 1307.4 TFLOPS dense,
  FP32 matrix 163.4 TFLOPS, 7 Infinity Fabric links, 896 GB/s aggregate
  (448 GB/s each way).
- MI325X: AMD Instinct MI325X data sheet — FP16/BF16 1307.4 TFLOPS dense,
  FP32 matrix 163.4 TFLOPS, Infinity Fabric 896 GB/s aggregate.
- MI250X: AMD Instinct MI250X data sheet — FP16/BF16 383 TFLOPS, FP32 matrix
  95.7 TFLOPS per package of two GCDs (halved here per device); 8 Infinity
  Fabric links of 100 GB/s per package.
- H100 SXM: NVIDIA H100 Tensor Core GPU data sheet — BF16/FP16 989.4 TFLOPS
  dense (1,979 with sparsity), FP32 66.9 TFLOPS, NVLink 900 GB/s (450 each way).
- H200: NVIDIA H200 Tensor Core GPU data sheet (SXM) — BF16/FP16 989 TFLOPS
  dense (1,979 with sparsity), FP32 67 TFLOPS, NVLink 900 GB/s.
- A100: NVIDIA A100 Tensor Core GPU data sheet (SXM4) — BF16/FP16 312 TFLOPS
  dense (624 with sparsity), FP32 19.5 TFLOPS, NVLink 600 GB/s (300 each way).

FP32 GEMM on NVIDIA is compared with the plain FP32 peak because torch
leaves TF32 off for matmul by default; AMD's FP32 GEMM runs on the matrix
cores, so its matrix FP32 peak applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peaks:
    model: str
    tflops: dict[str, float]  # dtype -> dense TFLOPS per torch device
    link_gbps: float | None  # GPU-to-GPU, per device and direction, GB/s


PEAKS: dict[str, Peaks] = {
    "MI300X": Peaks("MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}, 448.0),
    "MI325X": Peaks("MI325X", {"bf16": 1307.4, "fp16": 1307.4, "fp32": 163.4}, 448.0),
    "MI250X": Peaks("MI250X", {"bf16": 191.5, "fp16": 191.5, "fp32": 47.85}, 200.0),
    "H100 SXM": Peaks("H100 SXM", {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9}, 450.0),
    "H200": Peaks("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}, 450.0),
    "A100": Peaks("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}, 300.0),
}

# torch.cuda.get_device_name() -> table key; the first match wins, so the
# variants with other peaks (PCIe cards, NVL) come first and match nothing.
_NAMES: list[tuple[str, str | None]] = [
    (r"\bMI325X\b", "MI325X"),
    (r"\bMI300X\b", "MI300X"),
    (r"\bMI250X\b", "MI250X"),
    (r"\bH100\b.*\b(PCIe|NVL)\b", None),
    (r"\bH100\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3" is the SXM part
    (r"\bH200\b.*\bNVL\b", None),
    (r"\bH200\b", "H200"),
    (r"\bA100\b.*\bPCIE\b", None),
    (r"\bA100\b", "A100"),
]


def lookup(device_name: str) -> Peaks | None:
    """The peaks for a device as torch names it, or None for a model not in the table."""
    for pattern, key in _NAMES:
        if re.search(pattern, device_name, re.IGNORECASE):
            return PEAKS[key] if key is not None else None
    return None


@dataclass(frozen=True)
class Share:
    figure: str
    value: float
    unit: str
    peak: float | None
    share: float | None  # value / peak


_GEMM = re.compile(r"^gemm_(bf16|fp16|fp32)_\d+_tflops$")


def shares(figures: list[tuple[str, float, str]], peaks: Peaks | None) -> list[Share]:
    """Each figure with its peak and share; bus-bandwidth figures are compared
    with the link peak, GEMMs with their dtype's peak, others have none."""
    out = []
    for name, value, unit in figures:
        peak = None
        if peaks is not None:
            gemm = _GEMM.match(name)
            if gemm:
                peak = peaks.tflops.get(gemm.group(1))
            elif name.endswith("_busbw_gbps"):
                peak = peaks.link_gbps
        out.append(Share(name, value, unit, peak, value / peak if peak else None))
    return out


def table(rows: list[Share]) -> str:
    """A fixed-width table for a terminal."""
    lines = [f"{'figure':36} {'value':>10} {'unit':8} {'peak':>9} {'share':>7}"]
    for r in rows:
        peak = f"{r.peak:9.1f}" if r.peak else f"{'-':>9}"
        share = f"{r.share:7.1%}" if r.share is not None else f"{'-':>7}"
        lines.append(f"{r.figure:36} {r.value:10.2f} {r.unit:8} {peak} {share}")
    return "\n".join(lines)
