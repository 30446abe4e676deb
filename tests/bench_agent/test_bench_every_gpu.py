"""The standard level on every GPU: per-GPU figures, the node's weakest GPU
as the node's figure, the balance check naming that GPU, GEMM and HBM one
GPU at a time and the training step on all at once. The orchestration runs
here on CPU "devices" with the real kernels; the summary is pure."""

from __future__ import annotations

import threading

from libs.events import BenchCheck, Figure
from services.bench import levels, standard
from services.bench.config import StandardConfig, Timing
from services.bench.per_gpu import each_gpu, gpu_of, summarize
from services.bench.standard import Results


def gemm(tflops: float) -> Results:
    return Results(figures=[Figure(name="gemm_bf16_8192_tflops", value=tflops, unit="TFLOPS"),
                            Figure(name="train_step_ms", value=10.0, unit="ms"),
                            Figure(name="train_steps", value=24, unit="steps")],
                   checks=[BenchCheck(name="gemm_bf16_8192", status="ok")])


def test_the_node_is_as_good_as_its_weakest_gpu_and_the_check_names_it() -> None:
    per_gpu = {i: gemm(800.0) for i in range(8)}
    per_gpu[5] = gemm(560.0)  # 30% below its siblings
    out = summarize(per_gpu, max_shortfall=0.25)
    node = {f.name: f.value for f in out.figures if gpu_of(f.name) is None}
    assert node == {"gemm_bf16_8192_tflops": 560.0, "train_step_ms": 10.0}  # steps: per GPU only
    assert {f.name for f in out.figures if gpu_of(f.name) == 5} == {
        "gpu5_gemm_bf16_8192_tflops", "gpu5_train_step_ms", "gpu5_train_steps"}
    (balance,) = [c for c in out.checks if c.name == "gpu_balance"]
    assert balance.status == "failed"
    assert balance.detail.startswith("GPU 5 is the weakest: gemm_bf16_8192_tflops 560 TFLOPS, "
                                     "30% below the median of the node's 8 GPUs (800)")
    assert "gpu5_gemm_bf16_8192" in {c.name for c in out.checks}


def test_a_slow_step_time_counts_and_a_balanced_node_passes() -> None:
    per_gpu = {i: gemm(800.0 + i) for i in range(4)}
    slow = per_gpu[2].figures[1].model_copy(update={"value": 14.0})
    per_gpu[2].figures[1] = slow
    out = summarize(per_gpu, max_shortfall=0.25)
    node = {f.name: f.value for f in out.figures if gpu_of(f.name) is None}
    assert node["train_step_ms"] == 14.0 and node["gemm_bf16_8192_tflops"] == 800.0
    (balance,) = [c for c in out.checks if c.name == "gpu_balance"]
    assert balance.status == "failed" and balance.detail.startswith("GPU 2 is the weakest: "
                                                                    "train_step_ms 14")
    even = summarize({i: gemm(800.0) for i in range(4)}, max_shortfall=0.25)
    assert [c.status for c in even.checks if c.name == "gpu_balance"] == ["ok"]


def test_kernels_run_gpu_by_gpu_and_training_on_all_at_once() -> None:
    seen: list[str] = []
    running, most = [0], [0]
    lock = threading.Lock()

    def sequential(i: int) -> Results:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        with lock:
            running[0] -= 1
        return gemm(800.0)

    barrier = threading.Barrier(3, timeout=10)

    def together(i: int) -> Results:
        barrier.wait()  # only passes if all three run at once
        return Results(figures=[Figure(name="train_tokens_per_s", value=1000.0 + i,
                                       unit="tokens/s")])

    def broken(i: int) -> Results:
        if i == 1:
            raise RuntimeError("HIP error: an illegal memory access")
        return Results()

    out = each_gpu(3, [("GEMM", sequential), ("memory bandwidth", broken)],
                   [("trial training", together)], progress=seen.append)
    assert seen == ["GEMM on GPU 0", "GEMM on GPU 1", "GEMM on GPU 2",
                    "memory bandwidth on GPU 0", "memory bandwidth on GPU 1",
                    "memory bandwidth on GPU 2", "trial training on all 3 GPUs at once"]
    assert most[0] == 1
    assert [c.status for c in out[1].checks if c.name == "memory_bandwidth"] == ["failed"]
    assert not [c for c in out[0].checks if c.name == "memory_bandwidth"]
    assert out[2].figures[-1].value == 1002.0


def test_the_real_kernels_on_every_device() -> None:
    """levels.every_gpu with the CPU standing in for three devices."""
    cfg = StandardConfig(cpu_gemm_sizes=[64], cpu_membw_bytes=1 << 20, train_steps=6,
                         train_batch=2, train_seq=8,
                         timing=Timing(warmup=1, repeats=3, sample_s=0.01))
    steps: list[str] = []
    out = levels.every_gpu("cpu", 3, cfg, progress=steps.append)
    names = {f.name for f in out.figures}
    for i in range(3):
        assert {f"gpu{i}_gemm_fp32_64_tflops", f"gpu{i}_membw_copy_gbps",
                f"gpu{i}_train_tokens_per_s"} <= names
    assert {"gemm_fp32_64_tflops", "membw_triad_gbps", "train_tokens_per_s"} <= names
    assert any(c.name == "gpu_balance" for c in out.checks)
    assert steps[-1] == "trial training on all 3 GPUs at once"
    assert standard._torch_device("rocm", 3) == "cuda:3"
