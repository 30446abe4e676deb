"""The standard level's int8 and fp8 GEMMs (torch._int_mm, torch._scaled_mm),
run here on the CPU kernels torch has for both: figures in TOPS / TFLOPS, a
result checked against the fp32 product, and a device without the kernel
reported as skipped with the reason, not as a failure."""

from __future__ import annotations

import pytest
import torch

from services.bench import standard
from services.bench.config import StandardConfig, Timing

TIMING = Timing(warmup=1, repeats=3, sample_s=0.01)


def timer(fn):  # type: ignore[no-untyped-def]
    return standard._timer("cpu", TIMING)(fn)


@pytest.mark.parametrize(("dtype", "unit"), [("int8", "TOPS"), ("fp8", "TFLOPS")])
def test_an_eight_bit_gemm_gives_a_figure_and_a_checked_result(dtype: str, unit: str) -> None:
    out = standard.eight_bit_gemm(dtype, "cpu", [128, 256], timer,
                                  torch.Generator().manual_seed(0))
    assert [f.name for f in out.figures] == [f"gemm_{dtype}_128_{unit.lower()}",
                                             f"gemm_{dtype}_256_{unit.lower()}"]
    assert all(f.unit == unit and f.value > 0 for f in out.figures)
    assert [c.status for c in out.checks] == ["ok", "ok"], out.checks


def test_a_device_without_the_kernel_is_skipped_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("_int_mm is not implemented for this device\nmore")

    monkeypatch.setattr(torch, "_int_mm", refuse)
    out = standard.eight_bit_gemm("int8", "cpu", [128], timer, torch.Generator())
    assert out.figures == []
    (check,) = out.checks
    assert check.status == "skipped" and "not implemented for this device" in check.detail


def test_a_wrong_product_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: real(a, b) + 1)
    out = standard.eight_bit_gemm("int8", "cpu", [128], timer, torch.Generator())
    assert out.checks[0].status == "failed" and "differs" in out.checks[0].detail


def test_the_cpu_level_measures_fp32_only_and_says_why() -> None:
    config = StandardConfig(cpu_gemm_sizes=[64], timing=TIMING)
    out = standard.gemm_suite("cpu", config)
    assert {f.name for f in out.figures} == {"gemm_fp32_64_tflops"}
    assert StandardConfig().gpu_gemm_dtypes == ["bf16", "fp16", "fp32", "int8", "fp8"]
