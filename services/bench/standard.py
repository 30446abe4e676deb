"""Standard-level kernels on this node's device: GEMM per dtype and size,
memory bandwidth (copy and triad, as in STREAM) and a trial training run of
a small transformer. Each returns figures with units and pass/fail checks;
judging them is left to ``verdict`` and ``fleet``.

On a CPU only fp32 GEMM is measured: bf16/fp16 matmul there runs through
slow paths (~100x slower than fp32) and says nothing about the node, so the
result carries a "skipped" check saying so instead of a misleading figure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from libs.events import BenchCheck, Figure
from services.bench.config import StandardConfig, Timing
from services.bench.measure import Timing as Measured
from services.bench.measure import thread_queue_delay_s, time_kernel
from services.bench.verdict import training_checks


@dataclass
class Results:
    figures: list[Figure] = field(default_factory=list)
    checks: list[BenchCheck] = field(default_factory=list)

    def extend(self, other: Results) -> Results:
        self.figures += other.figures
        self.checks += other.checks
        return self


def _torch_device(kind: str, index: int | None = None) -> str:
    """torch's name for the device: GPU ``index`` of the node (None: the
    current one), or the CPU."""
    if kind not in ("cuda", "rocm"):
        return "cpu"
    return "cuda" if index is None else f"cuda:{index}"


Turn = Callable[[], object] | None  # called between timed samples (see turns.py)


def _timer(kind: str, timing: Timing, turn: Turn = None, device: str = "cuda"
           ) -> Callable[[Callable[[], object]], Measured]:
    import torch

    gpu = kind != "cpu"

    def sync() -> None:
        torch.cuda.synchronize(device)

    def run(fn: Callable[[], object]) -> Measured:
        return time_kernel(fn, repeats=timing.repeats, sample_s=timing.sample_s,
                           warmup=timing.warmup, sync=sync if gpu else None,
                           queue_delay=None if gpu else thread_queue_delay_s, between=turn)
    return run


def timing_for(kind: str, config: StandardConfig) -> Timing:
    return config.timing if kind == "cpu" else config.gpu_timing


def gemm_suite(kind: str, config: StandardConfig, turn: Turn = None,
               gpu: int | None = None) -> Results:
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    device = _torch_device(kind, gpu)
    sizes = config.cpu_gemm_sizes if kind == "cpu" else config.gpu_gemm_sizes
    wanted = ["fp32"] if kind == "cpu" else list(config.gpu_gemm_dtypes)
    timer = _timer(kind, timing_for(kind, config), turn, device)
    out = Results()
    if kind == "cpu":
        out.checks.append(BenchCheck(
            name="gemm_bf16_fp16", status="skipped",
            detail="CPU device: bf16/fp16 matmul is ~100x slower than fp32 there; "
                   "only fp32 is measured"))
    gen = torch.Generator(device="cpu").manual_seed(0)
    for dtype_name in [d for d in wanted if d in EIGHT_BIT]:  # GPUs only, as bf16/fp16
        out.extend(eight_bit_gemm(dtype_name, device, sizes, timer, gen))
    for dtype_name in [d for d in wanted if d not in EIGHT_BIT]:
        for size in sizes:
            a = torch.randn(size, size, generator=gen).to(device=device, dtype=dtypes[dtype_name])
            b = torch.randn(size, size, generator=gen).to(device=device, dtype=dtypes[dtype_name])
            c = torch.empty_like(a)
            t = timer(lambda a=a, b=b, c=c: torch.mm(a, b, out=c))
            name = f"gemm_{dtype_name}_{size}"
            finite = bool(torch.isfinite(c).all().item())
            out.figures.append(Figure(name=f"{name}_tflops",
                                      value=round(2 * size**3 / t.seconds / 1e12, 6),
                                      unit="TFLOPS"))
            out.checks.append(BenchCheck(
                name=name, status="ok" if finite else "failed",
                detail=f"median of {len(t.samples)} samples, spread {t.spread:.2f}"
                if finite else "result has NaN/Inf"))
            del a, b, c
    return out


EIGHT_BIT = ("int8", "fp8")


def fp8_dtype(device: str) -> object | None:
    """The e4m3 fp8 this device's matrix cores take: ``float8_e4m3fnuz`` on
    CDNA3 (MI300X/MI325X, gfx942), the OCP ``float8_e4m3fn`` elsewhere
    (H100/H200, MI355X, a CPU); None with a torch that has no fp8."""
    import torch

    if not hasattr(torch, "float8_e4m3fn"):
        return None
    if device == "cpu":
        return torch.float8_e4m3fn
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "") or ""
    return torch.float8_e4m3fnuz if arch.startswith("gfx94") else torch.float8_e4m3fn


def eight_bit_gemm(dtype_name: str, device: str, sizes: list[int],
                   timer: Callable[[Callable[[], object]], Measured], gen: object) -> Results:
    """int8 (``torch._int_mm``: int32 accumulate, TOPS) or fp8 e4m3
    (``torch._scaled_mm`` with unit scales, bf16 out, TFLOPS). A device or
    torch build without the kernel gets a "skipped" check saying so (the
    A100 and MI250X have no fp8); a wrong result fails the check: an 8-bit
    product of small integers is exact, so it is compared with fp32's."""
    import torch

    out = Results()
    fp8 = fp8_dtype(device) if dtype_name == "fp8" else None
    if dtype_name == "fp8" and fp8 is None:
        out.checks.append(BenchCheck(name="gemm_fp8", status="skipped",
                                     detail="this torch build has no float8 type"))
        return out
    one = torch.ones((), device=device, dtype=torch.float32)  # fp8's unit scales
    for size in sizes:
        # Small integers (-4..4): exact in int8 and e4m3, and their products
        # summed in int32 / fp32 accumulators too, so the check is equality.
        a = torch.randint(-4, 5, (size, size), generator=gen).to(device)  # type: ignore[arg-type]
        b = torch.randint(-4, 5, (size, size), generator=gen).to(device)  # type: ignore[arg-type]
        name = f"gemm_{dtype_name}_{size}"
        try:
            if dtype_name == "int8":
                # B column-major, as nn.Linear's weight is used: with a
                # row-major B, torch on CUDA falls back to a slow WMMA kernel
                # (pytorch/pytorch#165230): 128 against 960 TOPS on an H200
                # at 8192 (torch 2.11, CUDA 13).
                a8, b8 = a.to(torch.int8), b.to(torch.int8).t().contiguous().t()

                def run(a8: object = a8, b8: object = b8) -> object:
                    return torch._int_mm(a8, b8)  # type: ignore[arg-type]
            else:
                a8 = a.to(torch.float32).to(fp8)  # type: ignore[arg-type]
                b8 = b.to(torch.float32).to(fp8).t().contiguous().t()  # type: ignore[arg-type]

                def run(a8: object = a8, b8: object = b8) -> object:
                    return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,  # type: ignore[arg-type]
                                            out_dtype=torch.bfloat16)
            result = run()
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            out.checks.append(BenchCheck(name=f"gemm_{dtype_name}", status="skipped", detail=(
                f"{dtype_name} matmul not supported here: {str(exc).splitlines()[0][:200]}")))
            return out
        t = timer(run)
        want = a[:64].to(torch.float32) @ b[:, :64].to(torch.float32)
        got = result[:64, :64].to(torch.float32)  # type: ignore[index]
        right = bool(torch.equal(got, want)) if dtype_name == "int8" else bool(
            torch.allclose(got, want, rtol=1e-2, atol=1.0))  # bf16 rounding of the output
        unit = "TOPS" if dtype_name == "int8" else "TFLOPS"
        out.figures.append(Figure(name=f"{name}_{unit.lower()}",
                                  value=round(2 * size**3 / t.seconds / 1e12, 6), unit=unit))
        out.checks.append(BenchCheck(
            name=name, status="ok" if right else "failed",
            detail=f"median of {len(t.samples)} samples, spread {t.spread:.2f}" if right
            else "result differs from the fp32 product of the same integers"))
        del a, b, a8, b8, result
    return out


def memory_bandwidth(kind: str, config: StandardConfig, turn: Turn = None,
                     gpu: int | None = None) -> Results:
    """STREAM-style copy (2 x bytes moved) and triad a = b + s*c (3 x bytes)."""
    import torch

    device = _torch_device(kind, gpu)
    nbytes = config.cpu_membw_bytes if kind == "cpu" else config.gpu_membw_bytes
    n = nbytes // 4
    timer = _timer(kind, timing_for(kind, config), turn, device)
    a = torch.empty(n, device=device)
    b = torch.full((n,), 1.0, device=device)
    c = torch.full((n,), 2.0, device=device)
    copy = timer(lambda: a.copy_(b))
    triad = timer(lambda: torch.add(b, c, alpha=3.0, out=a))
    right = bool(torch.allclose(a[:1024], torch.full((1024,), 7.0, device=device)))
    out = Results(figures=[
        Figure(name="membw_copy_gbps", value=round(2 * n * 4 / copy.seconds / 1e9, 3),
               unit="GB/s"),
        Figure(name="membw_triad_gbps", value=round(3 * n * 4 / triad.seconds / 1e9, 3),
               unit="GB/s"),
    ])
    out.checks.append(BenchCheck(name="membw", status="ok" if right else "failed",
                                 detail=f"{nbytes / 2**20:.0f} MiB arrays" if right
                                 else "triad result wrong"))
    return out


def _tiny_lm(vocab: int, dim: int) -> object:
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim,
                                               batch_first=True, dropout=0.0)
            self.body = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(dim, vocab)

        def forward(self, tokens: object) -> object:
            return self.head(self.body(self.embed(tokens)))

    return TinyLM()


def trial_training(kind: str, config: StandardConfig, turn: Turn = None,
                   gpu: int | None = None) -> Results:
    """A few steps of a small transformer on a learnable sequence task (next
    token = token + 1): the loss must stay finite and fall, and the step time
    must be steady. Tokens per second is judged against the fleet."""
    import torch

    device = _torch_device(kind, gpu)
    vocab, dim = 64, 64 if kind == "cpu" else 512
    torch.manual_seed(0)
    model = _tiny_lm(vocab, dim).to(device)  # type: ignore[attr-defined]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    batch, seq = config.train_batch, config.train_seq
    losses: list[float] = []
    step_times: list[float] = []

    def step() -> None:
        q0, t0 = thread_queue_delay_s(), time.perf_counter()
        start = torch.randint(0, vocab, (batch, 1), generator=gen)
        tokens = ((start + torch.arange(seq + 1)) % vocab).to(device)
        logits = model(tokens[:, :-1])
        loss = loss_fn(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))  # .item() synchronises a GPU
        queued = thread_queue_delay_s() - q0 if kind == "cpu" else 0.0
        step_times.append(max(time.perf_counter() - t0 - queued, 1e-9))

    timing = timing_for(kind, config)
    t = _timer(kind, timing, turn, device)(step)
    while len(losses) < config.train_steps:  # a fast device: enough steps to learn
        step()
    tokens_per_s = batch * seq / t.seconds
    out = Results(figures=[
        Figure(name="train_tokens_per_s", value=round(tokens_per_s, 1), unit="tokens/s"),
        Figure(name="train_step_ms", value=round(1000 * t.seconds, 3), unit="ms"),
        Figure(name="train_steps", value=len(losses), unit="steps"),
        Figure(name="train_loss_first", value=round(losses[0], 4) if losses else math.nan,
               unit="nats"),
        Figure(name="train_loss_last", value=round(losses[-1], 4) if losses else math.nan,
               unit="nats"),
    ])
    out.checks += training_checks(losses, step_times[timing.warmup:],
                                  max_spread=config.max_step_time_spread)
    return out
