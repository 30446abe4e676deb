"""The standard level on every GPU of the node, and what the node's figures
are then.

Which runs how, and why:

- GEMM and HBM bandwidth run on one GPU at a time. Each is a figure of that
  GPU alone; run together, the node's shared power budget, the host's
  kernel-launch threads and PCIe would be in every figure, and the slow GPU
  could not be told from the slow node.
- The trial training step runs on every GPU at once, one thread each, as a
  data-parallel job runs them: a GPU that only throttles when the whole
  node is hot (power capping, a failing fan, a weak power supply) shows here.

Every per-GPU figure and check is kept as ``gpu<i>_<name>``. The node's own
figure under the plain name is its weakest GPU's (the lowest rate, the
longest step time): the fleet judgement and the floors then see the worst
GPU, and a node is as good as the GPU its gang waits for. A ``gpu_balance``
check names the weakest GPU and how far it is below the median of the
node's GPUs; beyond ``max_gpu_shortfall`` the check fails.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from libs.events import BenchCheck, Figure
from services.bench.standard import Results

HIGHER_IS_BETTER = frozenset({"TFLOPS", "TOPS", "GB/s", "tokens/s"})
LOWER_IS_BETTER = frozenset({"ms"})
_TAGGED = re.compile(r"^gpu(\d+)_(.+)$")
Measure = Callable[[int], Results]  # one GPU's results, by index


def tagged(gpu: int, results: Results) -> Results:
    """``results`` with every figure and check named for ``gpu``."""
    return Results(
        figures=[f.model_copy(update={"name": f"gpu{gpu}_{f.name}"}) for f in results.figures],
        checks=[c.model_copy(update={"name": f"gpu{gpu}_{c.name}"}) for c in results.checks])


def each_gpu(count: int, sequential: Sequence[tuple[str, Measure]],
             concurrent: Sequence[tuple[str, Measure]], *,
             progress: Callable[[str], None]) -> dict[int, Results]:
    """Run ``sequential`` steps GPU by GPU, then each ``concurrent`` step on
    every GPU at once; a step that raises is a failed check of that GPU."""
    out = {i: Results() for i in range(count)}
    for label, measure in sequential:
        for i in range(count):
            progress(f"{label} on GPU {i}")
            out[i].extend(_guarded(label, measure, i))
    for label, measure in concurrent:
        progress(f"{label} on all {count} GPUs at once")
        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="bench-gpu") as pool:
            done = list(pool.map(lambda i, m=measure, lb=label: _guarded(lb, m, i),
                                 range(count)))
        for i, results in enumerate(done):
            out[i].extend(results)
    return out


def _guarded(label: str, measure: Measure, gpu: int) -> Results:
    try:
        return measure(gpu)
    except Exception as exc:  # a broken kernel on one GPU is that GPU's failed check
        return Results(checks=[BenchCheck(name=label.replace(" ", "_"), status="failed",
                                          detail=f"{type(exc).__name__}: {exc}"[:300])])


def summarize(per_gpu: Mapping[int, Results], *, max_shortfall: float) -> Results:
    """Every GPU's figures and checks (tagged), the node's figures (its
    weakest GPU's), and the balance check. Pure."""
    out = Results()
    for gpu in sorted(per_gpu):
        out.extend(tagged(gpu, per_gpu[gpu]))
    values: dict[str, dict[int, float]] = {}
    units: dict[str, str] = {}
    for gpu, results in per_gpu.items():
        for f in results.figures:
            if f.unit in HIGHER_IS_BETTER or f.unit in LOWER_IS_BETTER:
                values.setdefault(f.name, {})[gpu] = f.value
                units[f.name] = f.unit
    worst: tuple[float, str, int, float, float] | None = None  # shortfall, name, gpu, v, median
    for name in sorted(values):
        by_gpu = values[name]
        lower = units[name] in LOWER_IS_BETTER
        gpu = (max if lower else min)(by_gpu, key=lambda g: by_gpu[g])
        out.figures.append(Figure(name=name, value=by_gpu[gpu], unit=units[name]))
        median = statistics.median(by_gpu.values())
        if len(by_gpu) < 2 or median <= 0:
            continue
        shortfall = (by_gpu[gpu] - median) / by_gpu[gpu] if lower else 1 - by_gpu[gpu] / median
        if worst is None or shortfall > worst[0]:
            worst = (shortfall, name, gpu, by_gpu[gpu], median)
    if worst is not None:
        shortfall, name, gpu, value, median = worst
        detail = (f"GPU {gpu} is the weakest: {name} {value:.4g} {units[name]}, "
                  f"{shortfall:.0%} below the median of the node's {len(per_gpu)} GPUs "
                  f"({median:.4g})")
        out.checks.append(BenchCheck(
            name="gpu_balance", status="failed" if shortfall > max_shortfall else "ok",
            detail=detail))
    return out


def gpu_of(name: str) -> int | None:
    """The GPU a tagged figure or check name belongs to (None: the node's)."""
    return untagged(name)[0]


def untagged(name: str) -> tuple[int | None, str]:
    """(GPU, name without its ``gpu<i>_`` tag); (None, name) for the node's."""
    found = _TAGGED.match(name)
    return (int(found.group(1)), found.group(2)) if found else (None, name)
