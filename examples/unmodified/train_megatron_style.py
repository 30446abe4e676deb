"""A training script that knows nothing of Primus-SaFE, written the way
Megatron-LM behaves at its edges.

It imports only the standard library and torch: no SDK, no NATS, no
PRIMUS_* variable. What the platform learns about it, it learns the way it
would from a real Megatron job:

* the process group comes from torchrun's variables (MASTER_ADDR,
  MASTER_PORT, RANK, WORLD_SIZE), gloo on the CPU;
* the last rank prints Megatron's ``training_log`` line every
  ``--log-interval`` iterations (``print_rank_last``), rank 0 the checkpoint
  messages (``print_rank_0``);
* ``--save DIR`` every ``--save-interval`` iterations writes Megatron's
  layout: ``iter_0000100/mp_rank_00/model_optim_rng.pt`` by rank 0 (the
  only data-parallel rank 0 of the one tensor/pipeline rank), a barrier, then
  ``latest_checkpointed_iteration.txt`` last, so a checkpoint counts only
  once every rank finished it;
* ``--load DIR`` reads that tracker and continues from its iteration with the
  model, optimizer and RNG state it saved (a missing tracker: from scratch,
  with Megatron's warning);
* SIGTERM is honoured at the next iteration by every rank together (with
  ``--exit-signal-handler``, after saving a checkpoint, as Megatron does).

The model is a small character-level MLP language model trained
data-parallel on a public-domain passage (one all-reduce of the gradients,
the loss and the stop flag per iteration). Each rank draws its batches from
a generator seeded by (seed, iteration, rank), and the CPU kernels run on one
thread, so an iteration redone after a resume computes the same loss as the
first time: the loss curve continues exactly where the checkpoint left it.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import sys
import time
from datetime import datetime, timedelta

import torch
import torch.distributed as dist
from torch import nn

TRACKER = "latest_checkpointed_iteration.txt"

# Lewis Carroll, "Alice's Adventures in Wonderland" (1865), the opening: public domain.
TEXT = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it, 'and what is the use of a book,' thought Alice "
    "'without pictures or conversations?' So she was considering in her own mind (as well as "
    "she could, for the hot day made her feel very sleepy and stupid), whether the pleasure of "
    "making a daisy-chain would be worth the trouble of getting up and picking the daisies, "
    "when suddenly a White Rabbit with pink eyes ran close by her. There was nothing so very "
    "remarkable in that; nor did Alice think it so very much out of the way to hear the Rabbit "
    "say to itself, 'Oh dear! Oh dear! I shall be late!' (when she thought it over afterwards, "
    "it occurred to her that she ought to have wondered at this, but at the time it all seemed "
    "quite natural); but when the Rabbit actually took a watch out of its waistcoat-pocket, and "
    "looked at it, and then hurried on, Alice started to her feet, for it flashed across her "
    "mind that she had never before seen a rabbit with either a waistcoat-pocket, or a watch to "
    "take out of it, and burning with curiosity, she ran across the field after it, and "
    "fortunately was just in time to see it pop down a large rabbit-hole under the hedge. "
)
VOCAB = sorted(set(TEXT))
DATA = torch.tensor([VOCAB.index(c) for c in TEXT])


class CharMLP(nn.Module):
    """Next character from the previous ``context`` ones."""

    def __init__(self, vocab: int, context: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(context * dim, hidden), nn.GELU(),
                                  nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens).flatten(1)))


def batch(args: argparse.Namespace, iteration: int, rank: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration * 1009 + rank)
    starts = torch.randint(0, len(DATA) - args.context - 1, (args.micro_batch_size,),
                           generator=gen)
    windows = torch.stack([DATA[s:s + args.context + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, -1]


def learning_rate(args: argparse.Namespace, iteration: int) -> float:
    """Linear warm-up, then cosine decay to a tenth (Megatron's --lr-decay-style
    cosine); a pure function of the iteration, so a resume needs no scheduler state."""
    if iteration <= args.lr_warmup_iters:
        return args.lr * iteration / max(args.lr_warmup_iters, 1)
    progress = (iteration - args.lr_warmup_iters) / max(args.train_iters - args.lr_warmup_iters, 1)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def print_rank_0(text: str) -> None:
    if dist.get_rank() == 0:
        print(text, flush=True)


def print_rank_last(text: str) -> None:
    if dist.get_rank() == dist.get_world_size() - 1:
        print(text, flush=True)


def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}", "mp_rank_00")


def save_checkpoint(args: argparse.Namespace, iteration: int, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> None:
    print_rank_0(f"saving checkpoint at iteration {iteration:7d} to {args.save} in torch format")
    if dist.get_rank() == 0:
        directory = checkpoint_dir(args.save, iteration)
        os.makedirs(directory, exist_ok=True)
        torch.save({
            "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str)},
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng_state": [{"random_rng_state": random.getstate(),
                           "torch_rng_state": torch.get_rng_state()}],
        }, os.path.join(directory, "model_optim_rng.pt"))
    # Every rank is done with this iteration before the tracker names it:
    # without the barrier a crash could leave a tracker naming a partial save.
    dist.barrier()
    if dist.get_rank() == 0:
        tracker = os.path.join(args.save, TRACKER)
        with open(tracker + ".tmp", "w") as f:
            f.write(str(iteration))
        os.replace(tracker + ".tmp", tracker)
    dist.barrier()
    print_rank_0(f"  successfully saved checkpoint from iteration {iteration:7d} to {args.save} "
                 "[ t 1/1, p 1/1 ]")


def load_checkpoint(args: argparse.Namespace, model: nn.Module,
                    optimizer: torch.optim.Optimizer) -> int:
    """The iteration the tracker in ``--load`` names (0: none, start from random)."""
    tracker = os.path.join(args.load, TRACKER)
    if not os.path.isfile(tracker):
        print_rank_0(f"WARNING: could not find the metadata file {tracker}")
        print_rank_0("    will not load any checkpoints and will start from random")
        return 0
    with open(tracker) as f:
        iteration = int(f.read().strip())
    print_rank_0(f" loading checkpoint from {args.load} at iteration {iteration}")
    state = torch.load(os.path.join(checkpoint_dir(args.load, iteration), "model_optim_rng.pt"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state["rng_state"][0]
    random.setstate(rng["random_rng_state"])
    torch.set_rng_state(rng["torch_rng_state"])
    print_rank_0(f"  successfully loaded checkpoint from {args.load} [ t 1/1, p 1/1 ] "
                 f"at iteration {iteration}")
    return iteration


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-iters", type=int, default=400)
    p.add_argument("--micro-batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup-iters", type=int, default=20)
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--save", default=None)
    p.add_argument("--save-interval", type=int, default=100)
    p.add_argument("--load", default=None)
    p.add_argument("--exit-signal-handler", action="store_true",
                   help="on SIGTERM, save a checkpoint before exiting")
    p.add_argument("--distributed-timeout-minutes", type=int, default=10)
    p.add_argument("--context", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=256)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # one core per rank; and the same kernels on every run
    # torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
    dist.init_process_group("gloo", timeout=timedelta(minutes=args.distributed_timeout_minutes))
    rank, world = dist.get_rank(), dist.get_world_size()
    print_rank_0(f"> initialized torch.distributed with backend gloo, world size {world}")
    stop = {"signal": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("signal", True))

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = CharMLP(len(VOCAB), args.context, 32, args.hidden_size)
    params = list(model.parameters())
    print_rank_0(f"> number of parameters: {sum(p.numel() for p in params)}")
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    iteration = load_checkpoint(args, model, optimizer) if args.load else 0
    global_batch = args.micro_batch_size * world
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    t_log = time.perf_counter()

    while iteration < args.train_iters:
        iteration += 1
        lr = learning_rate(args, iteration)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens, target = batch(args, iteration, rank)
        loss = loss_fn(model(tokens), target)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        # One collective: every gradient, the loss and "a rank was told to stop".
        flat = torch.cat([p.grad.reshape(-1) for p in params]
                         + [loss.detach().reshape(1), torch.tensor([float(stop["signal"])])])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p) / world)
            offset += n
        grad_norm = float(nn.utils.clip_grad_norm_(params, args.clip_grad))
        optimizer.step()
        losses.append(float(flat[-2]) / world)
        stopping = float(flat[-1]) > 0

        if iteration % args.log_interval == 0:
            elapsed_ms = (time.perf_counter() - t_log) * 1000 / args.log_interval
            t_log = time.perf_counter()
            print_rank_last(
                f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S')}]"
                f" iteration {iteration:8d}/{args.train_iters:8d} |"
                f" consumed samples: {iteration * global_batch:12d} |"
                f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
                f" learning rate: {lr:.6E} |"
                f" global batch size: {global_batch:5d} |"
                f" lm loss: {sum(losses) / len(losses):.6E} |"
                f" loss scale: 1.0 |"
                f" grad norm: {grad_norm:.3f} |"
                f" number of skipped iterations: {0:3d} |"
                f" number of nan iterations: {0:3d} |")
            losses = []
        if not math.isfinite(grad_norm):
            print_rank_0(f"grad norm is {grad_norm} at iteration {iteration}: stopping")
            return 3
        if stopping:
            if args.exit_signal_handler and args.save:
                save_checkpoint(args, iteration, model, optimizer)
            print_rank_0("exiting program after receiving SIGTERM.")
            dist.destroy_process_group()
            return 0
        if args.save and iteration % args.save_interval == 0:
            save_checkpoint(args, iteration, model, optimizer)

    if args.save and iteration % args.save_interval != 0:
        save_checkpoint(args, iteration, model, optimizer)
    print_rank_0(f"[after training is done] iteration {iteration}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
