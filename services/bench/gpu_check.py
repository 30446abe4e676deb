"""The steps of ``bench/gpu_check.sh``: large GEMMs and HBM bandwidth on
every GPU, the intra-node collectives over every GPU (under torchrun) held
against what the GPUs' links allow (``link_rates.intranode_check``), and a
report of each figure as a share of the device's published peak
(``gpu_peaks``).

    python -m services.bench.gpu_check gemm --out DIR/gemm.json
    torchrun --standalone --nproc-per-node N -m services.bench.gpu_check collectives --out F
    python -m services.bench.gpu_check report DIR

The measuring reuses the standard level's kernels and timing, so the check
and the fleet bench agree on what a figure means.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from libs.events import BenchCheck, Figure
from libs.worker_env import RankEnv
from services.bench.gpu_peaks import lookup, shares, table
from services.bench.per_gpu import summarize


def gemm(args: argparse.Namespace) -> int:
    import torch

    from services.bench import standard
    from services.bench.config import StandardConfig, Timing

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no GPU", file=sys.stderr)
        return 2
    kind = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    config = StandardConfig(gpu_gemm_sizes=args.sizes, gpu_gemm_dtypes=args.dtypes,
                            gpu_timing=Timing(warmup=3, repeats=5, sample_s=0.25))
    # Every GPU, one at a time (as the standard level measures them), each
    # figure tagged with its GPU; the node's own is its weakest GPU's.
    per_gpu = {}
    for i in range(torch.cuda.device_count()):
        print(f"   GPU {i}: GEMM and HBM", flush=True)
        per_gpu[i] = standard.gemm_suite(kind, config, gpu=i).extend(
            standard.memory_bandwidth(kind, config, gpu=i))
    results = summarize(per_gpu, max_shortfall=config.max_gpu_shortfall)
    failed = [c for c in results.checks if c.status == "failed"]
    Path(args.out).write_text(json.dumps({
        "device": torch.cuda.get_device_name(0), "kind": kind,
        "figures": [f.model_dump() for f in results.figures],
        "problems": [f"{c.name}: {c.detail}" for c in failed]}))
    return 1 if failed else 0


def collectives(args: argparse.Namespace) -> int:
    """One rank under torchrun; rank 0 writes the figures."""
    import torch

    from services.bench.collectives import RankPlan, _figures, _measure
    from services.bench.config import Timing

    env = RankEnv.from_env()  # torchrun's
    rank, world = env.rank, env.world_size
    plan = RankPlan("nccl", "env://", world, rank, env.local_rank, True,
                    tuple(args.bytes), Timing(warmup=5, repeats=5, sample_s=0.25), 120.0)
    samples = _measure(plan)
    if rank == 0:
        figures = _figures([{"samples": samples}], world, "")
        links = link_check(figures, args.bytes)
        Path(args.out).write_text(json.dumps({
            "device": torch.cuda.get_device_name(0), "ranks": world,
            "figures": [f.model_dump() for f in figures],
            "notes": [f"{links.name} {links.status}: {links.detail}"],
            "problems": [f"{links.name}: {links.detail}"] if links.status == "failed" else []}))
    return 0


def link_check(figures: list[Figure], sizes: list[int]) -> BenchCheck:
    """The largest message's figures against the links read from this
    machine, with the standard level's default share (link_rates.py)."""
    from services.bench.config import StandardConfig
    from services.bench.health.base import ProbeContext
    from services.bench.link_rates import intranode_check
    from services.bench.node_links import read_gpu_links

    links, why = read_gpu_links(ProbeContext())
    return intranode_check(figures, links, sizes=sizes,
                           min_fraction=StandardConfig().min_link_fraction, unread=why)


def report(args: argparse.Namespace) -> int:
    parts = [json.loads(p.read_text()) for p in sorted(Path(args.dir).glob("*.json"))]
    if not parts:
        print("gpu_check: nothing was measured", file=sys.stderr)
        return 1
    device = parts[0]["device"]
    peaks = lookup(device)
    rows = shares([(f["name"], f["value"], f["unit"]) for p in parts for f in p["figures"]],
                  peaks)
    print(f"{device} -> {peaks.model if peaks else 'no published peak in the table'}")
    print(table(rows))
    for p in parts:
        for note in p.get("notes", []):
            print(note)
        for problem in p.get("problems", []):
            print(f"problem: {problem}")
    print(json.dumps({
        "name": "gpu_check", "device": device, "model": peaks.model if peaks else None,
        "figures": [{"name": r.figure, "value": r.value, "unit": r.unit, "baseline": r.peak,
                     "ratio": round(r.share, 4) if r.share is not None else None}
                    for r in rows]}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--out", required=True)
    g.add_argument("--sizes", type=int, nargs="+", default=[8192])
    g.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp32", "int8", "fp8"],
                   choices=["bf16", "fp16", "fp32", "int8", "fp8"])
    c = sub.add_parser("collectives")
    c.add_argument("--out", required=True)
    c.add_argument("--bytes", type=int, nargs="+", default=[64 << 20, 1 << 30])
    r = sub.add_parser("report")
    r.add_argument("dir")
    args = parser.parse_args(argv)
    return {"gemm": gemm, "collectives": collectives, "report": report}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
