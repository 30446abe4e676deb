"""Quick-level measurements on this node: which compute devices torch sees
and a small GEMM timed and checked against a reference. ROCm and CUDA both
appear through torch.cuda; with neither, the CPU is measured and labelled as
such (device=cpu, dtype=fp32), so everything runs on a laptop."""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field

from libs.events import Figure


@dataclass(frozen=True)
class QuickMeasurement:
    device: str  # cpu | cuda | rocm
    device_count: int
    device_name: str
    dtype: str
    gemm_tflops: float
    gemm_max_abs_error: float
    driver: str
    figures: list[Figure] = field(default_factory=list)


def detect_device() -> tuple[str, int, str, str]:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        driver = torch.version.hip if kind == "rocm" else torch.version.cuda
        return kind, torch.cuda.device_count(), torch.cuda.get_device_name(0), str(driver)
    # The CPU counts as one device slot on a node without GPUs.
    return "cpu", 1, platform.processor() or platform.machine(), f"torch {torch.__version__}"


def gemm(size: int = 512, repeats: int = 5, device: str = "cpu") -> tuple[float, float]:
    """Median TFLOPS of a size×size fp32 matmul, and its max error vs float64."""
    import torch

    torch_device = "cuda" if device in ("cuda", "rocm") else "cpu"
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen)
    b = torch.randn(size, size, generator=gen)
    reference = (a.double() @ b.double()).float()
    a, b = a.to(torch_device), b.to(torch_device)
    out = a @ b  # warm-up
    times = []
    for _ in range(repeats):
        if torch_device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = a @ b
        if torch_device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    error = (out.cpu() - reference).abs().max().item()
    return 2 * size**3 / statistics.median(times) / 1e12, error


def quick() -> QuickMeasurement:
    device, count, name, driver = detect_device()
    tflops, error = gemm(device=device)
    return QuickMeasurement(
        device=device,
        device_count=count,
        device_name=name,
        dtype="fp32",
        gemm_tflops=tflops,
        gemm_max_abs_error=error,
        driver=driver,
        figures=[
            Figure(name="device_count", value=count, unit="devices"),
            Figure(name="gemm_fp32_512_tflops", value=round(tflops, 6), unit="TFLOPS"),
            Figure(name="gemm_fp32_512_max_abs_error", value=error, unit="abs"),
        ],
    )
