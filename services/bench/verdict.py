"""Pure verdicts over bench measurements: no I/O, no clock.

The quick level passes when the node shows at least the devices its inventory
promises and its GEMM is numerically right and not absurdly slow. The
standard level adds checks on the trial training run (finite, falling loss;
steady step time) and on every measured kernel. Fleet-relative judgement is
in ``fleet``; ``confirm`` combines a run with its retry, because a node is
failed only when the failure repeats: one bad run on a busy or briefly hot
node must not take it out of service.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from libs.events import BenchCheck
from services.bench.fleet import SEVERITY, Outcome, milder

# fp32 matmul of 512×512 accumulates ~512 products: errors above this mean a
# broken device or library, not rounding.
MAX_GEMM_ERROR = 1e-2
MIN_GEMM_TFLOPS = 1e-4
# The trial run must lose at least this share of its starting loss.
MIN_LOSS_DROP = 0.10


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


def training_checks(losses: list[float], step_times: list[float], *,
                    max_spread: float) -> list[BenchCheck]:
    """The trial run: every loss finite, the last quarter clearly below the
    first quarter, and the p90/p50 step time ratio below ``max_spread``."""
    out = []
    if not losses or not all(math.isfinite(v) for v in losses):
        bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
        out.append(BenchCheck(name="train_loss_finite", status="failed",
                              detail=f"loss not finite at step {bad}" if bad is not None
                              else "no steps ran"))
        return out
    out.append(BenchCheck(name="train_loss_finite", status="ok",
                          detail=f"{len(losses)} finite losses"))
    quarter = max(1, len(losses) // 4)
    first = sum(losses[:quarter]) / quarter
    last = sum(losses[-quarter:]) / quarter
    falling = last <= first * (1 - MIN_LOSS_DROP)
    out.append(BenchCheck(name="train_loss_falling", status="ok" if falling else "failed",
                          detail=f"loss {first:.3f} -> {last:.3f}"))
    if len(step_times) >= 4:
        ordered = sorted(step_times)
        p50 = ordered[len(ordered) // 2]
        p90 = ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
        spread = p90 / p50 if p50 > 0 else math.inf
        out.append(BenchCheck(
            name="train_step_time_stable", status="ok" if spread <= max_spread else "failed",
            detail=f"p90/p50 step time {spread:.2f} (limit {max_spread:g})"))
    return out


def judge_checks(checks: Iterable[BenchCheck]) -> tuple[Outcome, str]:
    """A run with any failed check is failed; unavailable and skipped are not."""
    failed = [c for c in checks if c.status == "failed"]
    if failed:
        return "failed", "; ".join(f"{c.name}: {c.detail}" for c in failed)
    return "healthy", "all checks passed"


def needs_retry(outcome: Outcome) -> bool:
    return outcome != "healthy"


def confirm(first: tuple[Outcome, str], retry: tuple[Outcome, str]) -> tuple[Outcome, str]:
    """The verdict of a run and its repeat: only what both runs show stands."""
    (a, why_a), (b, why_b) = first, retry
    if b == "healthy" and a != "healthy":
        return "healthy", f"transient: first run {a} ({why_a}); the retry was healthy"
    outcome = milder(a, b)
    if SEVERITY[a] == SEVERITY[b]:
        return outcome, f"{why_b} (repeated on retry)"
    return outcome, f"first run {a} ({why_a}); retry {b} ({why_b})"
