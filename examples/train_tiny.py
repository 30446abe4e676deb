"""A small language-model-shaped training job for the embedded stack.

Runs data-parallel (DDP over gloo on the CPU, NCCL/RCCL on GPUs) across the
workers the platform placed, reports every iteration through the Primus-SaFE
SDK and checkpoints every ``PRIMUS_CHECKPOINT_INTERVAL`` iterations; on start
it resumes from the newest complete checkpoint, so a restarted job continues
its loss curve.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from libs.sdk import Run


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=128, batch_first=True)
        self.body = nn.TransformerEncoder(layer, num_layers=1)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


def batch(step: int, rank: int, size: int = 16, length: int = 32, vocab: int = 64):
    # A learnable sequence task: predict the next token of "token + 1 mod vocab".
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    start = torch.randint(0, vocab, (size, 1), generator=gen)
    seq = (start + torch.arange(length + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def stop_agreed(run: Run, distributed: bool) -> bool:
    """Every rank stops at the same iteration: one asked, all agree."""
    flag = torch.tensor([1.0 if run.stop_requested else 0.0])
    if distributed:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--min-step-s", type=float, default=0.0,
                        help="pad each iteration to at least this long: the pace of a "
                             "heavier model, the same on a fast machine as on a slow one")
    args = parser.parse_args()

    run = Run.from_env()
    run.handle_preemption()
    distributed = run.world_size > 1
    if distributed:
        dist.init_process_group("gloo", rank=run.rank, world_size=run.world_size)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = 0
    resumed = run.load_checkpoint()
    if resumed is not None:
        start, state = resumed
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        print(f"resumed from checkpoint at iteration {start}", flush=True)
    ddp = DistributedDataParallel(model) if distributed else model
    loss_fn = nn.CrossEntropyLoss()
    value = float("nan")

    for iteration in range(start + 1, args.iterations + 1):
        t0 = time.perf_counter()
        tokens, target = batch(iteration, run.rank)
        logits = ddp(tokens)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (pad := args.min_step_s - (time.perf_counter() - t0)) > 0:
            time.sleep(pad)
        step_time = time.perf_counter() - t0
        value = loss.item()
        if not math.isfinite(value):
            print(f"loss is {value} at iteration {iteration}", flush=True)
            return 3
        run.report(iteration, loss=value, throughput=tokens.size(0) / step_time,
                   step_time_s=step_time)
        if stop_agreed(run, distributed):
            # Preempted or stopped: keep this step's work, then leave cleanly.
            run.save_checkpoint(iteration, {"model": model.state_dict(),
                                            "optimizer": optimizer.state_dict()})
            print(f"stopped at iteration {iteration} after a checkpoint", flush=True)
            break
        if run.should_checkpoint(iteration):
            run.save_checkpoint(iteration, {"model": model.state_dict(),
                                            "optimizer": optimizer.state_dict()})
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    run.close()
    if not run.stop_requested:
        print(f"done: {args.iterations} iterations (from {start}), final loss {value:.4f}, "
              f"dropped samples {run.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
