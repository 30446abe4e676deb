"""Pure verdicts over bench measurements: no I/O, no clock.

The quick level passes when the node shows at least the devices its inventory
promises and its GEMM is numerically right and not absurdly slow. Fleet-
relative judgement (median and MAD per GPU model) comes with the standard
level."""

from __future__ import annotations

from dataclasses import dataclass

# fp32 matmul of 512×512 accumulates ~512 products: errors above this mean a
# broken device or library, not rounding.
MAX_GEMM_ERROR = 1e-2
MIN_GEMM_TFLOPS = 1e-4


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


def judge_quick(
    *, device_count: int, expected_devices: int | None, gemm_tflops: float, gemm_error: float
) -> Verdict:
    problems = []
    if expected_devices is not None and device_count < expected_devices:
        problems.append(f"sees {device_count} device(s), inventory says {expected_devices}")
    if not gemm_error <= MAX_GEMM_ERROR:  # also catches NaN
        problems.append(f"GEMM result wrong: max error {gemm_error:.3g} > {MAX_GEMM_ERROR}")
    if not gemm_tflops >= MIN_GEMM_TFLOPS:
        problems.append(f"GEMM too slow: {gemm_tflops:.3g} TFLOPS < {MIN_GEMM_TFLOPS}")
    if problems:
        return Verdict(False, "; ".join(problems))
    return Verdict(True, "quick checks passed")
