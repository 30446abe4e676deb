"""The levels on this machine's CPU with torch (tiny sizes): every figure has
a unit, bf16 is skipped on the CPU and says why, the intra-node collectives
run over gloo between two processes, and the trial training learns. Plus the
nccl-tests bus-bandwidth formulas."""

from __future__ import annotations

import pytest

from libs.events import BenchRendezvous
from services.bench import collectives, levels
from services.bench.collectives import (
    busbw_allgather,
    busbw_allreduce,
    busbw_alltoall,
    size_label,
)
from services.bench.config import BenchConfig

TINY = BenchConfig.model_validate({"standard": {
    "cpu_gemm_sizes": [64], "cpu_membw_bytes": 1 << 20, "cpu_collective_bytes": [1 << 16],
    "train_steps": 8, "timing": {"warmup": 1, "repeats": 3, "sample_s": 0.01}}})


def test_bus_bandwidth_formulas_match_nccl_tests() -> None:
    # nccl-tests PERFORMANCE.md: busbw = algbw * 2(n-1)/n (all-reduce), (n-1)/n (all-gather).
    assert busbw_allreduce(8e9, 1.0, 8) == pytest.approx(8 * 2 * 7 / 8)
    assert busbw_allgather(8e9, 1.0, 8) == pytest.approx(8 * 7 / 8)
    assert busbw_allreduce(1e9, 1.0, 2) == pytest.approx(1.0)
    # alltoall: (n-1)/n of what each rank sends leaves it (nccl-tests alltoall).
    assert busbw_alltoall(8e9, 1.0, 8) == pytest.approx(8 * 7 / 8)
    assert [size_label(n) for n in (1 << 20, 3 << 30, 1536, 100)] == [
        "1MiB", "3GiB", "1536B", "100B"]


def test_quick_level_on_a_cpu() -> None:
    run = levels.run_level("quick", config=TINY, expected_devices=1)
    assert (run.device, run.device_count, run.dtype, run.outcome) == ("cpu", 1, "fp32", "healthy")
    names = {f.name for f in run.figures}
    assert {"device_count", "gemm_fp32_512_tflops"} <= names


def test_standard_level_on_a_cpu() -> None:
    steps: list[str] = []
    turns: list[int] = []
    run = levels.run_level("standard", config=TINY, expected_devices=1, progress=steps.append,
                           turn=lambda: turns.append(1))
    assert run.outcome == "healthy", run.reason
    assert steps == ["devices and GEMM", "GPU tool readings", "GEMM", "memory bandwidth",
                     "intra-node collectives", "trial training"]
    figures = {f.name: f for f in run.figures}
    for name in ("gemm_fp32_64_tflops", "membw_copy_gbps", "membw_triad_gbps",
                 "allreduce_64KiB_busbw_gbps", "allgather_64KiB_busbw_gbps",
                 "alltoall_64KiB_busbw_gbps", "train_tokens_per_s", "train_step_ms"):
        assert figures[name].value > 0 and figures[name].unit, name
    assert not any("bf16" in n for n in figures)
    checks = {c.name: c for c in run.checks}
    low_precision = checks["gemm_bf16_fp16"]
    assert low_precision.status == "skipped" and "100x" in low_precision.detail
    assert checks["intra_node_collectives"].detail == "2 ranks over gloo"
    assert checks["train_loss_falling"].status == "ok"
    # This machine has no GPU links and no GPU driver: both say so, neither fails.
    links = checks["intranode_link_rate"]
    assert links.status == "skipped" and links.detail.startswith("no link information: ")
    versions = checks["driver_versions"]
    assert versions.status == "skipped" and "no GPU driver loaded" in versions.detail
    assert all(f.unit for f in run.figures)
    assert len(turns) >= 3 * 5  # a turn passed after every timed sample


def test_a_multi_node_share_that_nobody_joins_fails_cleanly() -> None:
    port = collectives.free_port()
    rdv = BenchRendezvous(session="s", nodes=["me", "ghost"], master_addr="127.0.0.1",
                          master_port=port, timeout_s=3)
    run = levels.multi_node(rdv, "me", config=TINY)
    assert run.outcome == "failed"
    assert run.checks[0].name == "inter_node_collectives" and "ghost" in run.checks[0].detail
    stranger = levels.multi_node(rdv, "stranger", config=TINY)
    assert stranger.outcome == "failed" and "not in the rendezvous" in stranger.checks[0].detail
