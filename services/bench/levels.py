"""What each bench level runs, in order, on this node.

- quick (seconds): devices torch sees, a checked fp32 GEMM, the GPU tool's
  readings (count, temperature, ECC, PCIe link, XGMI, power, VRAM).
- standard (minutes on a GPU node, seconds on a CPU): quick, plus on every
  GPU GEMM per dtype and size and memory bandwidth (one GPU at a time) and a
  trial training run (all GPUs at once; see per_gpu.py), then intra-node
  all-reduce / all-gather / all-to-all, held against what the GPUs' links
  allow (link_rates.intranode_check), and the driver versions the node runs
  (for the coordinator's comparison with its fleet).
- full: standard, plus this node's share of a multi-node collective with a
  partner the coordinator chose (the agent adds that part: see agent.py).

Everything here blocks (torch); the agent runs it in a worker thread and
passes ``progress`` to hear each step as it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from libs.events import BenchCheck, BenchRendezvous, Figure
from services.bench import collectives, probes, standard
from services.bench import per_gpu as per_gpu_runs
from services.bench.config import BenchConfig, StandardConfig
from services.bench.fleet import Outcome
from services.bench.health.base import ProbeContext
from services.bench.health.rdma import sysfs_ports
from services.bench.health.versions import version_check
from services.bench.link_rates import internode_check, intranode_check
from services.bench.node_links import read_gpu_links
from services.bench.verdict import judge_checks, judge_quick

Progress = Callable[[str], None]


@dataclass
class LevelRun:
    device: str
    device_count: int
    device_name: str
    dtype: str = "fp32"
    figures: list[Figure] = field(default_factory=list)
    checks: list[BenchCheck] = field(default_factory=list)
    outcome: Outcome = "healthy"
    reason: str = ""

    def judge(self) -> LevelRun:
        self.outcome, self.reason = judge_checks(self.checks)
        return self


def _quiet(_: str) -> None:
    pass


def _set_cpu_threads(kind: str, config: BenchConfig) -> None:
    if kind == "cpu":
        import torch

        torch.set_num_threads(config.standard.cpu_threads)


def quick(*, config: BenchConfig, expected_devices: int | None,
          progress: Progress = _quiet) -> LevelRun:
    progress("devices and GEMM")
    kind, _, _, _ = probes.detect_device()
    _set_cpu_threads(kind, config)
    measured = probes.quick()
    verdict = judge_quick(device_count=measured.device_count, expected_devices=expected_devices,
                          gemm_tflops=measured.gemm_tflops, gemm_error=measured.gemm_max_abs_error)
    run = LevelRun(measured.device, measured.device_count, measured.device_name, measured.dtype,
                   list(measured.figures))
    run.checks.append(BenchCheck(name="quick", status="ok" if verdict.passed else "failed",
                                 detail=verdict.reason))
    progress("GPU tool readings")
    checks, figures, _ = probes.gpu_readings(
        expected=expected_devices if measured.device != "cpu" else None,
        limits=config.gpu_limits)
    run.checks += checks
    run.figures += [f for f in figures if f.name != "gpu_count"]
    return run.judge()


def standard_level(*, config: BenchConfig, expected_devices: int | None,
                   progress: Progress = _quiet, turn: standard.Turn = None) -> LevelRun:
    """``turn`` is called between timed samples and steps: a node of a sweep
    on shared hardware passes the turn to the next node there."""
    run = quick(config=config, expected_devices=expected_devices, progress=progress)
    kind, cfg = run.device, config.standard
    gpus = run.device_count if kind != "cpu" else 0
    if gpus:
        # Every GPU (services/bench/per_gpu.py: GEMM and HBM one GPU at a
        # time, the training step on all at once), then the collectives.
        measured = every_gpu(kind, gpus, cfg, turn=turn, progress=progress)
        run.figures += measured.figures
        run.checks += measured.checks
    steps: list[tuple[str, Callable[[], tuple[list[Figure], list[BenchCheck]]]]] = [] if gpus \
        else [("GEMM", lambda: _pair(standard.gemm_suite(kind, cfg, turn))),
              ("memory bandwidth", lambda: _pair(standard.memory_bandwidth(kind, cfg, turn)))]
    steps += [
        ("intra-node collectives", lambda: collectives.intra_node(
            gpus=gpus, sizes=cfg.cpu_collective_bytes if kind == "cpu"
            else cfg.gpu_collective_bytes, cpu_ranks=cfg.cpu_collective_ranks,
            timing=standard.timing_for(kind, cfg), timeout_s=cfg.collective_timeout_s)),
    ]
    if not gpus:
        steps.append(("trial training", lambda: _pair(standard.trial_training(kind, cfg, turn))))
    for label, step in steps:
        progress(label)
        try:
            figures, checks = step()
        except Exception as exc:  # a broken kernel is a failed check, not a dead agent
            figures, checks = [], [BenchCheck(name=label.replace(" ", "_"), status="failed",
                                              detail=f"{type(exc).__name__}: {exc}"[:300])]
        run.figures += figures
        run.checks += checks
        if turn is not None:
            turn()
    run.checks.append(intranode_links(run.figures, gpus=gpus, config=cfg))
    run.checks.append(version_check(ProbeContext()))
    return run.judge()


def intranode_links(figures: list[Figure], *, gpus: int, config: StandardConfig) -> BenchCheck:
    """The intra-node collectives against the links read from this node
    (right after they ran, while the GPUs' PCIe links are still trained up)."""
    links, why = read_gpu_links(ProbeContext())
    if links and not gpus:
        links, why = [], "the collectives ran on CPU ranks, not over the GPUs' links"
    return intranode_check(figures, links, sizes=config.gpu_collective_bytes,
                           min_fraction=config.min_link_fraction, unread=why)


def every_gpu(kind: str, count: int, cfg: StandardConfig, *, turn: standard.Turn = None,
              progress: Progress = _quiet) -> standard.Results:
    """The standard kernels on each of ``count`` devices, summarized: per-GPU
    figures, the node's (its weakest GPU's) and the balance check."""
    def between(results: standard.Results) -> standard.Results:
        if turn is not None:
            turn()
        return results

    per_gpu = per_gpu_runs.each_gpu(count, sequential=[
        ("GEMM", lambda i: between(standard.gemm_suite(kind, cfg, turn, gpu=i))),
        ("memory bandwidth", lambda i: between(standard.memory_bandwidth(kind, cfg, turn, gpu=i))),
    ], concurrent=[
        # turn-taking is one thread's business: the GPUs train together here
        ("trial training", lambda i: standard.trial_training(kind, cfg, None, gpu=i)),
    ], progress=progress)
    return per_gpu_runs.summarize(per_gpu, max_shortfall=cfg.max_gpu_shortfall)


def multi_node(rdv: BenchRendezvous, node: str, *, config: BenchConfig,
               progress: Progress = _quiet) -> LevelRun:
    """Only this node's share of a multi-node collective."""
    kind, count, name, _ = probes.detect_device()
    progress(f"collective with {', '.join(n for n in rdv.nodes if n != node)}")
    gpus = count if kind != "cpu" else 0
    sizes = config.full.gpu_internode_bytes if gpus else config.full.internode_bytes
    figures, checks = collectives.inter_node(
        rdv, node, gpus=gpus, sizes=sizes, timing=standard.timing_for(kind, config.standard))
    if gpus and figures:  # against the rate of the node's RDMA ports
        checks.append(internode_check(figures, sysfs_ports(ProbeContext()), sizes=sizes,
                                      min_fraction=config.full.min_link_fraction))
    return LevelRun(kind, count, name, "fp32", figures, checks).judge()


def run_level(level: str, *, config: BenchConfig, expected_devices: int | None,
              progress: Progress = _quiet, turn: standard.Turn = None) -> LevelRun:
    if level == "quick":
        return quick(config=config, expected_devices=expected_devices, progress=progress)
    return standard_level(config=config, expected_devices=expected_devices, progress=progress,
                          turn=turn)


def _pair(results: standard.Results) -> tuple[list[Figure], list[BenchCheck]]:
    return results.figures, results.checks
