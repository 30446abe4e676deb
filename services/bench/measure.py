"""Timing a benchmark kernel so the figure describes the device, not the
machine's other tenants.

Each figure is the median of ``repeats`` samples taken after ``warmup``
untimed calls; a sample repeats the kernel until at least ``sample_s`` has
passed, so one sample spans many scheduler slices and duty cycles.

On a GPU the clock is the wall clock around a device synchronisation. On a
CPU "device" the wall clock also counts the time our thread sat runnable but
waiting for a core while other processes ran (the kernel's run-queue delay,
``/proc/thread-self/schedstat``); that time is subtracted, so a node's figure
does not depend on its neighbours' load. Time the thread was *not runnable*
— stopped, throttled, blocked on I/O — still counts: it is the node being
slow. Where schedstat is missing the plain wall clock is used.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def thread_queue_delay_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (0 if unknown)."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Timing:
    """The time of one call of a kernel."""

    seconds: float  # median over samples of (effective time / calls)
    samples: list[float]  # per-call seconds of each sample
    calls: int  # timed calls in all samples
    wall_s: float  # wall time of all samples
    queued_s: float  # run-queue delay subtracted from it

    @property
    def spread(self) -> float:
        """Max/min of the samples: how steady the measurement was."""
        return max(self.samples) / min(self.samples) if min(self.samples) > 0 else float("inf")


def time_kernel(
    fn: Callable[[], object], *, repeats: int, sample_s: float, warmup: int = 1,
    sync: Callable[[], object] | None = None,
    queue_delay: Callable[[], float] | None = thread_queue_delay_s,
    clock: Callable[[], float] = time.perf_counter,
    between: Callable[[], object] | None = None,
) -> Timing:
    """Median seconds per call of ``fn``. ``sync`` waits for the device (GPU):
    then each sample launches a fixed number of calls, sized from the warm-up,
    and synchronises once. ``queue_delay`` (None: plain wall clock) is
    subtracted from each sample. ``between`` runs after each sample, untimed
    (a node of a sweep on shared hardware passes the turn there)."""
    if sync is not None:
        t0 = clock()
        for _ in range(max(warmup, 1)):
            fn()
        sync()
        per_call = max((clock() - t0) / max(warmup, 1), 1e-9)
        batch = max(1, math.ceil(sample_s / per_call))
    else:
        for _ in range(warmup):
            fn()
        batch = 0
    samples, calls, wall, queued = [], 0, 0.0, 0.0
    for _ in range(repeats):
        n = 0
        q0 = queue_delay() if queue_delay is not None else 0.0
        t0 = clock()
        while True:
            fn()
            n += 1
            if batch and n < batch:
                continue
            if sync is not None:
                sync()
            elapsed = clock() - t0
            if batch or elapsed >= sample_s:
                break
        q = (queue_delay() - q0) if queue_delay is not None else 0.0
        q = min(max(q, 0.0), elapsed * 0.99)  # never below 1% of the wall time
        samples.append((elapsed - q) / n)
        calls, wall, queued = calls + n, wall + elapsed, queued + q
        if between is not None:
            between()
    return Timing(statistics.median(samples), samples, calls, wall, queued)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile (0..1) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
