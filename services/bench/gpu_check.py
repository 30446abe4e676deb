"""The steps of ``bench/gpu_check.sh``: the bench agent's own standard level
on this machine (every GPU, every dtype, HBM, the training step, the
intra-node collectives and the link check), the node-health catalogue once,
and a report of each figure per GPU and as a share of the device's
published peak (``gpu_peaks``), held against the default floors.

    python -m services.bench.gpu_check level --out DIR/level.json
    python -m services.bench.gpu_check health --out DIR/health.json
    python -m services.bench.gpu_check report DIR

The level step calls ``levels.standard_level``, the function the agent runs
at onboarding, so the check and the fleet agree on what a figure means.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from libs.events import BenchCheck, Figure
from services.bench.config import BenchConfig
from services.bench.fleet import judge_node
from services.bench.gpu_peaks import GemmDtype, Peaks, gemm_of, lookup, shares, table
from services.bench.per_gpu import gpu_of, untagged

_DTYPES: tuple[str, ...] = get_args(GemmDtype)


def _dump(path: str, **data: object) -> None:
    Path(path).write_text(json.dumps(data, default=lambda m: m.model_dump()))


def level(args: argparse.Namespace) -> int:
    import torch

    from services.bench import levels

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no GPU", file=sys.stderr)
        return 2
    base = BenchConfig()
    updates: dict[str, object] = {}
    if args.sizes:
        updates["gpu_gemm_sizes"] = args.sizes
    if args.dtypes:
        updates["gpu_gemm_dtypes"] = args.dtypes
    if args.collective_bytes:
        updates["gpu_collective_bytes"] = args.collective_bytes
    config = base.model_copy(update={"standard": base.standard.model_copy(update=updates)})
    count = torch.cuda.device_count()
    run = levels.standard_level(config=config, expected_devices=count,
                                progress=lambda step: print(f"   {step}", flush=True))
    _dump(args.out, device=torch.cuda.get_device_name(0), kind=run.device, gpus=count,
          outcome=run.outcome, reason=run.reason, figures=run.figures, checks=run.checks)
    return 0 if run.outcome == "healthy" else 1


def health(args: argparse.Namespace) -> int:
    """Every probe the agent schedules by default, run once, as it runs them."""
    from services.bench import probes

    config = BenchConfig()
    checks = []
    for spec in config.scheduled_probes():
        print(f"   {spec.name}", flush=True)
        checks.append(probes.run_check(spec.kind, expected=None, limits=config.gpu_limits,
                                       timeout_s=spec.timeout_s, name=spec.name,
                                       options=spec.options))
    _dump(args.out, figures=[], checks=checks)
    return 1 if any(c.status == "failed" for c in checks) else 0


# Besides the largest GEMM per dtype: each GPU's memory and training figures.
_OTHER = {"membw_copy_gbps": "copy GB/s", "membw_triad_gbps": "triad GB/s",
          "train_step_ms": "step ms", "train_tokens_per_s": "train tok/s"}


def gpu_table(figures: Sequence[Figure], peaks: Peaks | None) -> str:
    """One row per GPU of the largest GEMM per dtype, HBM copy and triad and
    the training rate, then the node's row (its weakest GPU's) and each
    column's share of the published peak. Pure."""
    per_gpu: dict[int, dict[str, float]] = {}
    node: dict[str, float] = {}
    largest: dict[str, int] = {}
    for f in figures:
        gpu, name = untagged(f.name)
        gemm = gemm_of(name)
        if gemm is None and name not in _OTHER:
            continue
        if gemm is not None:
            largest[gemm[0]] = max(largest.get(gemm[0], 0), gemm[1])
        (per_gpu.setdefault(gpu, {}) if gpu is not None else node)[name] = f.value
    gemms = sorted((_DTYPES.index(g[0]), n) for n in node
                   if (g := gemm_of(n)) is not None and largest[g[0]] == g[1])
    columns = [n for _, n in gemms] + [n for n in _OTHER if n in node]
    if not columns:
        return "no per-GPU figures"
    heads = [_head(c) for c in columns]
    width = max(9, *(len(h) for h in heads))
    lines = [f"{'':>12} " + " ".join(f"{h:>{width}}" for h in heads)]
    for gpu in sorted(per_gpu):
        lines.append(f"{'GPU ' + str(gpu):>12} " + " ".join(
            f"{per_gpu[gpu].get(c, float('nan')):>{width}.1f}" for c in columns))
    lines.append(f"{'node':>12} " + " ".join(f"{node[c]:>{width}.1f}" for c in columns))
    share = {r.figure: r.share for r in shares([(c, node[c], "") for c in columns], peaks)}
    lines.append(f"{'% of peak':>12} " + " ".join(
        f"{share[c]:>{width}.1%}" if share[c] is not None else f"{'-':>{width}}"
        for c in columns))
    return "\n".join(lines)


def _head(name: str) -> str:
    gemm = gemm_of(name)
    if gemm is None:
        return _OTHER[name]
    return f"{gemm[0]} {'TOPS' if name.endswith('_tops') else 'TFLOPS'}"


def report(args: argparse.Namespace) -> int:
    parts = [json.loads(p.read_text()) for p in sorted(Path(args.dir).glob("*.json"))]
    if not parts:
        print("gpu_check: nothing was measured", file=sys.stderr)
        return 1
    device = next((p["device"] for p in parts if p.get("device")), "unknown device")
    level = next((p for p in parts if "outcome" in p), None)
    peaks = lookup(device)
    figures = [Figure.model_validate(f) for p in parts for f in p["figures"]]
    checks = [BenchCheck.model_validate(c) for p in parts for c in p.get("checks", [])]
    node = [f for f in figures if gpu_of(f.name) is None]
    print(f"{device} -> {peaks.model if peaks else 'no published peak in the table'}")
    print(gpu_table(figures, peaks))
    rows = shares([(f.name, f.value, f.unit) for f in node], peaks)
    print(table([r for r in rows if r.peak is not None] or rows))
    # The floors as the coordinator holds them (fleet.judge_node), with no
    # peers: only the floors can fail a figure here.
    config = BenchConfig()
    floors = config.floors_of(device, [f.name for f in node])
    judged = judge_node([(f.name, f.value, f.unit) for f in node], {}, policy=config.fleet,
                        floors=floors)
    below = [f"{v.name} {v.value:.4g} {v.unit} is below its floor {floors[v.name]:.4g}"
             for v in judged.figures if v.outcome == "failed"]
    print(f"floors: {len(floors) - len(below)} of {len(floors)} held"
          + "".join(f"\nproblem: {b}" for b in below))
    for c in checks:
        if gpu_of(c.name) is None or c.status == "failed":
            print(f"{c.status:>11}  {c.name}: {c.detail}")
    if level is not None:
        print(f"standard level: {level['outcome']}"
              + (f": {level['reason']}" if level.get("reason") else ""))
    print(json.dumps({
        "name": "gpu_check", "device": device, "model": peaks.model if peaks else None,
        "outcome": level["outcome"] if level is not None else None,
        "failed_checks": sorted(c.name for c in checks if c.status == "failed"),
        "below_floor": len(below),
        "figures": [{"name": r.figure, "value": r.value, "unit": r.unit, "baseline": r.peak,
                     "ratio": round(r.share, 4) if r.share is not None else None}
                    for r in rows]}))
    return 1 if below else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    g = sub.add_parser("level", help="the standard level, as the bench agent runs it")
    g.add_argument("--out", required=True)
    g.add_argument("--sizes", type=int, nargs="+", help="GEMM sizes (default: the level's)")
    g.add_argument("--dtypes", nargs="+", choices=_DTYPES, help="GEMM dtypes (default: all)")
    g.add_argument("--collective-bytes", type=int, nargs="+",
                   help="intra-node message sizes (default: the level's, up to 1 GiB)")
    h = sub.add_parser("health", help="every node-health catalogue probe, once")
    h.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("dir")
    args = parser.parse_args(argv)
    return {"level": level, "health": health, "report": report}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
