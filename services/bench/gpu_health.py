"""GPU health checks over what a management tool reported (pure).

``libs.gpu.probe_gpus`` runs amd-smi, rocm-smi or nvidia-smi and returns one
normalised inventory; here each check kind (count, temperature, ECC, PCIe
link, XGMI, power, VRAM) becomes ok / failed / unavailable with the reason.
No tool, a tool that could not be understood, or a tool that does not report
a reading makes the check *unavailable* — a missing tool is not a broken GPU.
The same readings become figures with units for the bench result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from libs.events import BenchCheck, Figure
from libs.gpu import GpuSample, ProbeResult
from services.bench.config import GpuLimits

GPU_KINDS = ("gpu_count", "gpu_temperature", "gpu_ecc", "gpu_pcie", "gpu_xgmi", "gpu_power",
             "gpu_vram")


def _check(kind: str, status: str, detail: str) -> BenchCheck:
    return BenchCheck(name=kind, status=status, detail=detail)  # type: ignore[arg-type]


def _per_gpu(kind: str, gpus: Iterable[GpuSample], read: Callable[[GpuSample], float | None],
             bad: Callable[[float], str | None]) -> BenchCheck:
    """ok when every reported reading passes ``bad`` (which returns a reason)."""
    seen, problems = 0, []
    for gpu in gpus:
        value = read(gpu)
        if value is None:
            continue
        seen += 1
        why = bad(value)
        if why:
            problems.append(f"GPU {gpu.index}: {why}")
    if not seen:
        return _check(kind, "unavailable", "the tool reports no such reading")
    if problems:
        return _check(kind, "failed", "; ".join(problems))
    return _check(kind, "ok", f"{seen} GPU(s) within limits")


def _above(limit: float | None, say: Callable[[float], str]) -> Callable[[float], str | None]:
    """A reading is bad when a limit is set and the reading exceeds it."""
    return lambda v: say(v) if limit is not None and v > limit else None


def _power_share(g: GpuSample) -> float | None:
    if g.power_w is None:
        return None
    return g.power_w / g.power_cap_w if g.power_cap_w else 0.0


def _vram_share(g: GpuSample) -> float | None:
    if g.vram_used_bytes is None or not g.vram_total_bytes:
        return None
    return g.vram_used_bytes / g.vram_total_bytes


def _per_kind(kind: str, gpus: tuple[GpuSample, ...], limits: GpuLimits) -> BenchCheck:
    if kind == "gpu_temperature":
        top = limits.max_temp_c
        return _per_gpu(kind, gpus, lambda g: g.hottest_c,
                        _above(top, lambda v: f"{v:g} °C > {top:g} °C"))
    if kind == "gpu_ecc":
        return _per_gpu(kind, gpus, lambda g: g.ecc_uncorrectable,
                        _above(limits.max_ecc_uncorrectable,
                               lambda v: f"{v:g} uncorrectable ECC error(s)"))
    if kind == "gpu_xgmi":
        return _per_gpu(kind, gpus, lambda g: g.xgmi_errors,
                        _above(limits.max_xgmi_errors, lambda v: f"XGMI errors {v:g}"))
    if kind == "gpu_pcie":
        return _pcie(gpus, limits)
    if kind == "gpu_power":
        return _per_gpu(kind, gpus, _power_share,
                        _above(limits.max_power_over_cap,
                               lambda v: f"drawing {v:.0%} of its power cap"))
    if kind == "gpu_vram":
        return _per_gpu(kind, gpus, _vram_share,
                        _above(limits.max_vram_used_fraction,
                               lambda v: f"{v:.0%} of VRAM in use before any job"))
    return _check(kind, "unavailable", f"unknown GPU check {kind!r}")


def gpu_checks(probe: ProbeResult, *, expected: int | None, limits: GpuLimits,
               kinds: Iterable[str] = GPU_KINDS) -> list[BenchCheck]:
    """One check per requested kind, in the order asked."""
    wanted = list(kinds)
    if probe.status != "ok" or probe.inventory is None:
        why = probe.reason or probe.status
        detail = "no GPU tool answered" if probe.status == "unavailable" else \
            "GPU tool output unusable"
        # The tools tried and why each failed, once: the same for every kind.
        return [_check(k, "unavailable", f"{detail}: {why}" if i == 0 else detail)
                for i, k in enumerate(wanted)]
    gpus = probe.inventory.gpus
    tool = probe.tool or "tool"
    out = []
    for kind in wanted:
        if kind != "gpu_count":
            out.append(_per_kind(kind, gpus, limits))
        elif expected is not None and len(gpus) < expected:
            out.append(_check(kind, "failed",
                              f"{tool} sees {len(gpus)} GPU(s), inventory says {expected}"))
        else:
            out.append(_check(kind, "ok", f"{tool} sees {len(gpus)} GPU(s)"))
    return out


def _pcie(gpus: tuple[GpuSample, ...], limits: GpuLimits) -> BenchCheck:
    seen, problems = 0, []
    for gpu in gpus:
        width, speed = gpu.pcie_link_width, gpu.pcie_link_speed_gts
        if width is None and speed is None:
            continue
        seen += 1
        if limits.min_pcie_width is not None and width is not None \
                and width < limits.min_pcie_width:
            problems.append(f"GPU {gpu.index}: link x{width} < x{limits.min_pcie_width}")
        if limits.min_pcie_speed_gts is not None and speed is not None \
                and speed < limits.min_pcie_speed_gts:
            problems.append(f"GPU {gpu.index}: link {speed:g} GT/s < "
                            f"{limits.min_pcie_speed_gts:g} GT/s")
    if not seen:
        return _check("gpu_pcie", "unavailable", "the tool reports no PCIe link")
    if problems:
        return _check("gpu_pcie", "failed", "; ".join(problems))
    return _check("gpu_pcie", "ok", f"{seen} link(s) within limits")


def gpu_figures(probe: ProbeResult) -> list[Figure]:
    """Node-level GPU readings with units (only those the tool reported)."""
    if probe.status != "ok" or probe.inventory is None:
        return []
    gpus = probe.inventory.gpus
    figures = [Figure(name="gpu_count", value=len(gpus), unit="devices")]

    def add(name: str, unit: str, values: list[float], fold: Callable[[list[float]], float]
            ) -> None:
        if values:
            figures.append(Figure(name=name, value=round(fold(values), 3), unit=unit))

    add("gpu_temp_max_c", "°C", [g.hottest_c for g in gpus if g.hottest_c is not None], max)
    add("gpu_power_total_w", "W", [g.power_w for g in gpus if g.power_w is not None], sum)
    add("gpu_vram_total_bytes", "bytes",
        [float(g.vram_total_bytes) for g in gpus if g.vram_total_bytes is not None], sum)
    add("gpu_ecc_uncorrectable_total", "errors",
        [float(g.ecc_uncorrectable) for g in gpus if g.ecc_uncorrectable is not None], sum)
    add("gpu_pcie_width_min", "lanes",
        [float(g.pcie_link_width) for g in gpus if g.pcie_link_width is not None], min)
    add("gpu_pcie_speed_min_gts", "GT/s",
        [g.pcie_link_speed_gts for g in gpus if g.pcie_link_speed_gts is not None], min)
    add("gpu_xgmi_errors_total", "errors",
        [float(g.xgmi_errors) for g in gpus if g.xgmi_errors is not None], sum)
    return figures
