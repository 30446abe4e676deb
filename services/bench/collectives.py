"""Collective bandwidth through torch.distributed: all-reduce, all-gather and
all-to-all within a node (every GPU of the node over NCCL/RCCL, or two gloo processes on
a CPU-only node) and between nodes (the agents of a rendezvous).

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md), so figures compare
with what operators already know: algbw = bytes / time, and for n ranks
all-reduce busbw = algbw * 2(n-1)/n, all-gather busbw = algbw * (n-1)/n with
bytes the gathered (output) size, all-to-all busbw = algbw * (n-1)/n with
bytes what each rank sends in all (1/n of it stays on the rank).

Ranks run as child processes of a forkserver that has imported torch once,
so a bench run does not pay torch's import per rank and the children never
inherit the agent's threads. Every rank runs the same number of calls per
sample (rank 0 sizes the batch from its warm-up and broadcasts it).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue as queue_mod
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from libs.events import BenchCheck, BenchRendezvous, Figure
from services.bench.config import Timing

OPS = ("allreduce", "allgather", "alltoall")
# Between nodes: the gradient all-reduce and the expert-parallel all-to-all.
INTER_NODE_OPS = ("allreduce", "alltoall")


def busbw_allreduce(nbytes: float, seconds: float, ranks: int) -> float:
    """GB/s on the bus for an all-reduce of ``nbytes`` per rank."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def busbw_allgather(total_bytes: float, seconds: float, ranks: int) -> float:
    """GB/s on the bus for an all-gather whose output is ``total_bytes``."""
    return total_bytes / seconds / 1e9 * (ranks - 1) / ranks


def busbw_alltoall(nbytes: float, seconds: float, ranks: int) -> float:
    """GB/s on the bus for an all-to-all where each rank sends ``nbytes`` in all."""
    return nbytes / seconds / 1e9 * (ranks - 1) / ranks


BUSBW = {"allreduce": busbw_allreduce, "allgather": busbw_allgather,
         "alltoall": busbw_alltoall}


def size_label(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


@dataclass(frozen=True)
class RankPlan:
    backend: str  # gloo | nccl
    init_method: str
    world: int
    rank: int
    local_rank: int
    gpu: bool
    sizes: tuple[int, ...]
    timing: Timing
    timeout_s: float
    ops: tuple[str, ...] = OPS


def _rank_main(plan: RankPlan, out: Any) -> None:
    """One rank: measure every op and size, put the samples (or the error) on ``out``."""
    try:
        out.put({"rank": plan.rank, "ok": True, "samples": _measure(plan)})
    except BaseException as exc:  # reported to the parent, never raised in a child
        out.put({"rank": plan.rank, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})


def _measure(plan: RankPlan) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist

    if plan.gpu:
        torch.cuda.set_device(plan.local_rank)
        device = torch.device("cuda", plan.local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group(plan.backend, init_method=plan.init_method, world_size=plan.world,
                            rank=plan.rank, timeout=timedelta(seconds=plan.timeout_s))

    def sync() -> None:
        if plan.gpu:
            torch.cuda.synchronize()

    try:
        probe = torch.ones(4, device=device)
        dist.all_reduce(probe)
        sync()
        if probe[0].item() != plan.world:
            raise RuntimeError(f"all-reduce of ones gave {probe[0].item()}, not {plan.world}")
        samples: dict[str, list[float]] = {}
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        for nbytes in plan.sizes:
            count = max(plan.world, nbytes // 4 // plan.world * plan.world)
            full = torch.ones(count, device=device)
            part = torch.ones(count // plan.world, device=device)
            spread = torch.empty_like(full)
            ops = {"allreduce": lambda full=full: dist.all_reduce(full),
                   "allgather": lambda full=full, part=part: gather(full, part),
                   "alltoall": lambda full=full, spread=spread: dist.all_to_all_single(
                       spread, full)}
            for op, fn in ops.items():
                if op not in plan.ops:
                    continue
                t0 = time.perf_counter()
                for _ in range(max(plan.timing.warmup, 1)):
                    fn()
                sync()
                per_call = torch.tensor([(time.perf_counter() - t0) / max(plan.timing.warmup, 1)])
                dist.broadcast(per_call, src=0)  # every rank runs the same number of calls
                calls = max(1, round(plan.timing.sample_s / max(per_call.item(), 1e-9)))
                rows = []
                for _ in range(plan.timing.repeats):
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    sync()
                    rows.append((time.perf_counter() - t0) / calls)
                samples[f"{op}/{count * 4}"] = rows
            del full, part, spread
        return samples
    finally:
        dist.destroy_process_group()


def _spawn(plans: list[RankPlan], timeout_s: float) -> list[dict[str, Any]]:
    """Run the ranks as forkserver children; their reports, or raise on a failure."""
    ctx = mp.get_context("forkserver")
    with contextlib.suppress(ValueError):
        ctx.set_forkserver_preload(["services.bench.collectives", "torch.distributed"])
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(p, out), daemon=True) for p in plans]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(reports) < len(plans):
            try:
                reports.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue_mod.Empty:
                raise TimeoutError(f"ranks did not finish within {timeout_s:g} s") from None
            if not reports[-1]["ok"]:
                raise RuntimeError(f"rank {reports[-1]['rank']}: {reports[-1]['error']}")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return sorted(reports, key=lambda r: r["rank"])


def _figures(reports: list[dict[str, Any]], world: int, prefix: str) -> list[Figure]:
    """Per op and size: the median over samples of rank 0's wall time per call.

    No run-queue correction here: the ranks' own threads queue behind each
    other, so the delay summed over threads can exceed the wall time. On a
    shared CPU these figures are noisy, and the fleet weighs them by their
    spread (``fleet.judge_node``)."""
    figures = []
    for key, rows in reports[0]["samples"].items():
        op, nbytes = key.split("/")
        seconds = statistics.median(rows)
        figures.append(Figure(
            name=f"{prefix}{op}_{size_label(int(nbytes))}_busbw_gbps",
            value=round(BUSBW[op](int(nbytes), seconds, world), 4), unit="GB/s"))
    return figures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def intra_node(*, gpus: int, sizes: list[int], cpu_ranks: int, timing: Timing,
               timeout_s: float) -> tuple[list[Figure], list[BenchCheck]]:
    """All-reduce, all-gather and all-to-all over every GPU of this node (or
    ``cpu_ranks`` gloo processes on a CPU-only node)."""
    gpu = gpus > 0
    world = gpus if gpu else cpu_ranks
    if world < 2:
        return [], [BenchCheck(name="intra_node_collectives", status="skipped",
                               detail="one GPU: nothing to reduce across")]
    init = f"tcp://127.0.0.1:{free_port()}"
    plans = [RankPlan("nccl" if gpu else "gloo", init, world, r, r, gpu, tuple(sizes), timing,
                      timeout_s) for r in range(world)]
    try:
        reports = _spawn(plans, timeout_s + 30)
    except Exception as exc:
        return [], [BenchCheck(name="intra_node_collectives", status="failed", detail=str(exc))]
    backend = plans[0].backend
    return _figures(reports, world, ""), [BenchCheck(
        name="intra_node_collectives", status="ok",
        detail=f"{world} ranks over {backend}")]


def inter_node(rdv: BenchRendezvous, node: str, *, gpus: int, sizes: list[int],
               timing: Timing) -> tuple[list[Figure], list[BenchCheck]]:
    """This node's share of a multi-node collective: ``ranks_per_node`` local
    ranks joining the others at the rendezvous's master."""
    gpu = gpus > 0
    if node not in rdv.nodes:
        return [], [BenchCheck(name="inter_node_collectives", status="failed",
                               detail=f"{node} is not in the rendezvous {rdv.nodes}")]
    local = min(rdv.ranks_per_node, gpus) if gpu else 1
    world = len(rdv.nodes) * local
    base = rdv.nodes.index(node) * local
    init = f"tcp://{rdv.master_addr}:{rdv.master_port}"
    plans = [RankPlan("nccl" if gpu else "gloo", init, world, base + r, r, gpu,
                      tuple(sizes), timing, rdv.timeout_s, INTER_NODE_OPS) for r in range(local)]
    try:
        reports = _spawn(plans, rdv.timeout_s + 30)
    except Exception as exc:
        return [], [BenchCheck(name="inter_node_collectives", status="failed",
                               detail=f"with {', '.join(n for n in rdv.nodes if n != node)}: "
                                      f"{exc}")]
    return _figures(reports, world, "internode_"), [BenchCheck(
        name="inter_node_collectives", status="ok",
        detail=f"{len(rdv.nodes)} nodes, {world} ranks")]
