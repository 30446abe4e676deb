"""Published peak figures of the GPUs this project targets, per torch device,
and measured figures as a share of them (pure).

A GEMM at 70% of peak is healthy on one model and a bad node on another only
if you know the peak: ``bench/gpu_check.sh`` prints every figure as a share
of the vendor's number. Peaks are dense (no structured sparsity), per device
torch sees (an MI250X package is two devices, one per GCD), and the link
figure is the per-direction bandwidth of one device's GPU-to-GPU links, which
is what an nccl-tests all-reduce bus bandwidth approaches.

Sources (vendor product pages and data sheets; dense figures, INT8 in TOPS):
- MI355X: https://www.amd.com/en/products/accelerators/instinct/mi350/mi355x.html
  FP16/BF16 2.5 PFLOPS (2516.6 = 2400 MHz x 512 FMA x 2 x 1024 Matrix
  Cores), OCP-FP8 and INT8 5033.2, FP32 matrix 157.3 TFLOPS, HBM3E 8 TB/s,
  Infinity Fabric 7 links of 153.6 GB/s (1075 GB/s aggregate, 537.6 each
  way). The "with structured sparsity" figures are exactly twice these.
- MI300X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html
  FP16/BF16 1307.4, FP8 and INT8 2614.9, FP32 matrix 163.4 TFLOPS, HBM3
  5.3 TB/s, 7 Infinity Fabric links, 896 GB/s aggregate (448 GB/s each way).
- MI325X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html
  the MI300X's compute (1307.4 / 2614.9 / 163.4), HBM3E 6 TB/s, Infinity
  Fabric 896 GB/s aggregate.
- MI250X: https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html
  FP16/BF16 383, INT8 383 TOPS, FP32 matrix 95.7 TFLOPS, HBM2e 3.2 TB/s per
  package of two GCDs (halved here per device; no FP8); 8 Infinity Fabric
  links of 100 GB/s per package.
- H100 SXM: https://www.nvidia.com/en-us/data-center/h100/ BF16/FP16 989.4
  dense (1,979 with sparsity), FP8 and INT8 1,978.9, FP32 66.9 TFLOPS, HBM3
  3.35 TB/s, NVLink 900 GB/s (450 each way).
- H200: https://www.nvidia.com/en-us/data-center/h200/ (SXM) the H100's
  compute (989 / 1,979 / 67), HBM3e 4.8 TB/s, NVLink 900 GB/s.
- A100: https://www.nvidia.com/en-us/data-center/a100/ (SXM4 80GB)
  BF16/FP16 312 dense (624 with sparsity), INT8 624 TOPS, FP32 19.5 TFLOPS,
  HBM2e 2.039 TB/s, NVLink 600 GB/s (300 each way); no FP8.
Cross-checked against the dense-figure table of stas00/ml-engineering,
compute/accelerator/README.md ("TFLOPS comparison table", commit read
2026-12), which derives the AMD BF16 figures from clock x Matrix Cores.

FP32 GEMM on NVIDIA is compared with the plain FP32 peak because torch
leaves TF32 off for matmul by default; AMD's FP32 GEMM runs on the matrix
cores, so its matrix FP32 peak applies.

Floors: a figure below ``fraction x peak`` fails the node whatever its fleet
measures (a fleet of throttled GPUs is still throttled). ``DEFAULT_FLOORS``
are deliberately well under what healthy parts reach with torch at 8192^3
(a public MI350X run: 1,019 TFLOPS fp16, 44% of its peak), so only a GPU
that has lost about half its speed trips them; ``peak_floors`` in the bench
configuration sets others per dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args


@dataclass(frozen=True)
class Peaks:
    model: str
    tflops: dict[str, float]  # dtype -> dense TFLOPS (int8: TOPS) per torch device
    link_gbps: float | None  # GPU-to-GPU, per device and direction, GB/s
    hbm_gbps: float | None = None  # memory bandwidth per torch device, GB/s


def _dense(bf16: float, fp32: float, int8: float, fp8: float | None = None) -> dict[str, float]:
    out = {"bf16": bf16, "fp16": bf16, "fp32": fp32, "int8": int8}
    if fp8 is not None:
        out["fp8"] = fp8
    return out


PEAKS: dict[str, Peaks] = {
    "MI355X": Peaks("MI355X", _dense(2516.6, 157.3, 5033.2, 5033.2), 537.6, 8000.0),
    "MI300X": Peaks("MI300X", _dense(1307.4, 163.4, 2614.9, 2614.9), 448.0, 5300.0),
    "MI325X": Peaks("MI325X", _dense(1307.4, 163.4, 2614.9, 2614.9), 448.0, 6000.0),
    "MI250X": Peaks("MI250X", _dense(191.5, 47.85, 191.5), 200.0, 1600.0),
    "H100 SXM": Peaks("H100 SXM", _dense(989.4, 66.9, 1978.9, 1978.9), 450.0, 3350.0),
    "H200": Peaks("H200", _dense(989.0, 67.0, 1979.0, 1979.0), 450.0, 4800.0),
    "A100": Peaks("A100", _dense(312.0, 19.5, 624.0), 300.0, 2039.0),
}

# Fraction of peak below which a figure fails the node (see the module's
# docstring): GEMM per dtype at sizes of at least FLOOR_MIN_GEMM, and HBM
# copy/triad bandwidth ("hbm").
# No int8/fp8 floor by default: torch's torch._int_mm and _scaled_mm kernels
# differ by release and vendor far more than its bf16 GEMM, so a share that
# fits one fleet would fail healthy nodes of another; set them per fleet.
DEFAULT_FLOORS: dict[str, float] = {"bf16": 0.35, "fp16": 0.35, "fp32": 0.35, "hbm": 0.5}
FLOOR_MIN_GEMM = 8192

# torch.cuda.get_device_name() -> table key; the first match wins, so the
# variants with other peaks (PCIe cards, NVL) come first and match nothing.
_NAMES: list[tuple[str, str | None]] = [
    (r"\bMI355X\b", "MI355X"),
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


GemmDtype = Literal["bf16", "fp16", "fp32", "int8", "fp8"]
"""The dtypes the standard level runs GEMMs in (figures ``gemm_<dtype>_<n>_...``)."""
# A node's figure, or one GPU's (``gpu3_gemm_...``, services/bench/per_gpu.py).
_GEMM = re.compile(rf"^(?:gpu\d+_)?gemm_({'|'.join(get_args(GemmDtype))})_(\d+)_(?:tflops|tops)$")
_HBM = re.compile(r"^(?:gpu\d+_)?membw_(copy|triad)_gbps$")


def gemm_of(name: str) -> tuple[str, int] | None:
    """(dtype, size) of a GEMM figure's name, a node's or one GPU's; None
    for any other figure."""
    found = _GEMM.match(name)
    return (found.group(1), int(found.group(2))) if found else None


def shares(figures: list[tuple[str, float, str]], peaks: Peaks | None) -> list[Share]:
    """Each figure with its peak and share; bus-bandwidth figures are compared
    with the link peak, GEMMs with their dtype's peak, others have none."""
    out = []
    for name, value, unit in figures:
        peak = None
        if peaks is not None:
            gemm = gemm_of(name)
            if gemm:
                peak = peaks.tflops.get(gemm[0])
            elif name.endswith("_busbw_gbps"):
                peak = peaks.link_gbps
            elif _HBM.match(name):
                peak = peaks.hbm_gbps
        out.append(Share(name, value, unit, peak, value / peak if peak else None))
    return out


def peak_floors(figures: list[str], peaks: Peaks | None,
                fractions: dict[str, float]) -> dict[str, float]:
    """Absolute floors for ``figures`` of a device: ``fractions[dtype] x
    peak`` for GEMMs of at least FLOOR_MIN_GEMM (smaller ones do not reach
    peak on any part) and ``fractions["hbm"] x`` the memory bandwidth for the
    copy and triad figures. Pure; {} for a model without published peaks."""
    if peaks is None:
        return {}
    out = {}
    for name in figures:
        gemm = gemm_of(name)
        if gemm and gemm[1] >= FLOOR_MIN_GEMM:
            dtype = gemm[0]
            if dtype in peaks.tflops and dtype in fractions:
                out[name] = round(fractions[dtype] * peaks.tflops[dtype], 3)
        elif _HBM.match(name) and peaks.hbm_gbps and "hbm" in fractions:
            out[name] = round(fractions["hbm"] * peaks.hbm_gbps, 3)
    return out


def table(rows: list[Share]) -> str:
    """A fixed-width table for a terminal."""
    lines = [f"{'figure':36} {'value':>10} {'unit':8} {'peak':>9} {'share':>7}"]
    for r in rows:
        peak = f"{r.peak:9.1f}" if r.peak else f"{'-':>9}"
        share = f"{r.share:7.1%}" if r.share is not None else f"{'-':>7}"
        lines.append(f"{r.figure:36} {r.value:10.2f} {r.unit:8} {peak} {share}")
    return "\n".join(lines)
