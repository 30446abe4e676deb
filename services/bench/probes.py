"""Quick-level measurements on this node: which compute devices torch sees,
a small GEMM timed and checked against a reference, and the GPU management
tool's readings (``libs.gpu.probe_gpus``). ROCm and CUDA both appear through
torch.cuda; with neither, the CPU is measured and labelled as such
(device=cpu, dtype=fp32), so everything runs on a laptop. The periodic health
probes of the agent run the same functions (``run_check``)."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from libs.events import BenchCheck, Figure
from libs.gpu import ProbeResult, probe_gpus
from services.bench.config import GpuLimits
from services.bench.gpu_health import GPU_KINDS, gpu_checks, gpu_figures
from services.bench.health import CATALOGUE
from services.bench.health.base import ProbeContext
from services.bench.verdict import MAX_GEMM_ERROR


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


def gpu_readings(*, expected: int | None, limits: GpuLimits, kinds: tuple[str, ...] = GPU_KINDS,
                 timeout_s: float = 10.0) -> tuple[list[BenchCheck], list[Figure], ProbeResult]:
    """The GPU tool's view of this node as checks and figures; never raises
    (no tool: every check is unavailable)."""
    probe = probe_gpus(timeout_s=timeout_s)
    return gpu_checks(probe, expected=expected, limits=limits, kinds=kinds), \
        gpu_figures(probe), probe


# Each catalogue probe's memory between its runs on this node (a kernel-log
# cursor, the last AER counters), by probe name: the agent's process lifetime.
_HEALTH_STATE: dict[str, dict[str, Any]] = {}


def run_check(kind: str, *, expected: int | None, limits: GpuLimits, timeout_s: float,
              name: str | None = None, options: Mapping[str, Any] | None = None
              ) -> BenchCheck:
    """One periodic health probe. A catalogue probe's ``unknown`` (it could not
    tell) is ``unavailable`` and its ``not_applicable`` is ``skipped``: neither
    counts toward a failing streak."""
    if kind in CATALOGUE:
        entry = CATALOGUE[kind]
        state = _HEALTH_STATE.setdefault(name or kind, {})
        context = ProbeContext(state=state, options={**entry.options, **(options or {})},
                               timeout_s=timeout_s)
        try:
            found = entry.run(context)
        except Exception as exc:  # a parser bug says unknown, never a failed node
            return BenchCheck(name=name or kind, status="unavailable",
                              detail=f"unknown: {type(exc).__name__}: {exc}"[:300])
        status, prefix = {"ok": ("ok", ""), "failed": ("failed", ""),
                          "unknown": ("unavailable", "unknown: "),
                          "not_applicable": ("skipped", "not applicable: ")}[found.status]
        return BenchCheck(name=name or kind, status=status,  # type: ignore[arg-type]
                          detail=(prefix + found.detail)[:500])
    if kind == "gemm":
        device, _, _, _ = detect_device()
        tflops, error = gemm(size=256, repeats=3, device=device)
        ok = error <= MAX_GEMM_ERROR and tflops > 0
        return BenchCheck(name=kind, status="ok" if ok else "failed",
                          detail=f"{tflops:.3g} TFLOPS, max error {error:.2g}")
    checks, _, _ = gpu_readings(expected=expected, limits=limits, kinds=(kind,),
                                timeout_s=timeout_s)
    return checks[0]
