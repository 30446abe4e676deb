"""``primus-safe lens ...``: what Lens knows about a node or a job, asked over
the bus with the collector's named queries (never SQL from here).

- ``lens node NODE``: the node's telemetry, its GPUs now, its open alerts;
- ``lens job JOB``: loss curve, throughput, checkpoints and alerts, and
  the GPUs it ran on (node, rank, utilisation, VRAM, power) with its GPU-hours;
- ``lens gpu-hours [--workspace W] [--job J] [--since T] [--until T]
  [--by job|workspace]``: GPU-hours per job (default) or per workspace;
- ``lens events [--job J] [--node N]``: metrics, events, alerts and logs on
  one timeline;
- ``lens alerts [--job J] [--node N] [--open]`` and ``lens logs ...``;
- ``lens report --job J -o report.html``: a self-contained HTML report with
  plots (see ``lens_report``);
- ``lens parse FILE [--format auto|NAME] [--formats MORE.yaml]``: what Lens
  reads from a training log (``libs/log_formats``), to check a format before
  submitting; local, no bus;
- ``lens checkpoint DIR [--world-size N]``: the newest complete checkpoint
  in a job's checkpoint directory, whatever framework wrote it
  (``libs/checkpoint_layouts``), and the ones still being written; local;
- ``lens silence create|list|expire``: Alertmanager silences of Lens alerts
  (see ``lens_silence``).

Every verb takes ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from cli.client import CliError, connect, lens_query
from cli.output import format_table, time_ms
from libs.settings import Settings


def add_parser(sub: Any) -> None:
    lens_p = sub.add_parser("lens", help="telemetry, history, alerts and logs from Lens")
    lsub = lens_p.add_subparsers(dest="lens_verb", required=True)
    s = lsub.add_parser("job", help="loss curve, throughput, checkpoints, alerts of a job")
    s.add_argument("id")
    s.add_argument("--limit", type=int, default=10000)
    s.add_argument("--json", action="store_true")
    s = lsub.add_parser("gpu-hours", help="GPU-hours per job or per workspace")
    s.add_argument("--by", choices=["job", "workspace"], default="job")
    s.add_argument("--workspace", help="only this workspace's jobs")
    s.add_argument("--job", help="only this job")
    s.add_argument("--since", default=None,
                   help="from: a duration back (2h, 7d, 4w) or a time (ISO 8601); default all")
    s.add_argument("--until", default=None, help="to (same forms); default now")
    s.add_argument("--limit", type=int, default=1000, help="at most this many jobs")
    s.add_argument("--json", action="store_true")
    s = lsub.add_parser("node", help="a node's telemetry, its GPUs and alerts")
    s.add_argument("id")
    s.add_argument("--minutes", type=int, default=60)
    s.add_argument("--limit", type=int, default=10000)
    s.add_argument("--json", action="store_true")
    for verb, what in (("events", "metrics, events, alerts and logs on one timeline"),
                       ("alerts", "alerts, newest first"), ("logs", "log lines")):
        s = lsub.add_parser(verb, help=what)
        s.add_argument("--job")
        s.add_argument("--node")
        s.add_argument("--limit", type=int, default=200)
        s.add_argument("--json", action="store_true")
        if verb == "alerts":
            s.add_argument("--open", action="store_true", help="only alerts still open")
        if verb == "events":
            s.add_argument("--step", type=int, default=10, help="seconds per metric row")
    s = lsub.add_parser("parse", help="the telemetry Lens reads from a training log file")
    s.add_argument("file", help="a log file, or - for standard input")
    s.add_argument("--format", default="auto", help="auto (detect) or a format name")
    s.add_argument("--formats", action="append", default=[], metavar="FILE",
                   help="more formats (YAML like libs/log_formats.yaml); may repeat")
    s.add_argument("--json", action="store_true")
    s = lsub.add_parser("checkpoint", help="the newest complete checkpoint in a directory")
    s.add_argument("dir", help="the job's checkpoint directory")
    s.add_argument("--world-size", type=int, default=None,
                   help="ranks of the job (judges the platform SDK's own layout)")
    s.add_argument("--json", action="store_true")
    s = lsub.add_parser("report", help="a self-contained HTML report of a job, with plots")
    s.add_argument("--job", required=True)
    s.add_argument("-o", "--output", default=None, help="default: report-<job>.html")
    s.add_argument("--json", action="store_true", help="print the data instead")
    from cli import lens_silence
    lens_silence.add_parser(lsub)


def parse_log(args: argparse.Namespace) -> int:
    """``lens parse``: one record per line that carries telemetry."""
    from libs.log_formats import Parser
    from libs.specs import SpecError

    try:
        parser = Parser.load(*(Path(f) for f in args.formats))
    except SpecError as exc:
        raise CliError(str(exc)) from None
    if args.format != "auto" and args.format not in parser.names:
        raise CliError(f"unknown log format {args.format!r}: use auto or one of "
                       f"{', '.join(parser.names)} (or add one with --formats FILE)")
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise CliError(f"{args.file}: cannot read it ({exc.strerror or exc})") from None
    # Logs are not always UTF-8 (a progress bar cut mid-character, binary dumps).
    lines = raw.decode("utf-8", errors="backslashreplace").splitlines()
    name = parser.detect(lines) if args.format == "auto" else args.format
    records = [] if name is None else parser.parse_lines(lines, name)
    if args.json:
        print(json.dumps({"format": name, "records": [r.as_dict() for r in records]}, indent=2))
        return 0
    if name is None:
        print(f"{args.file}: no known training-log format in its first lines "
              f"(known: {', '.join(parser.names)}); try --format NAME", file=sys.stderr)
        return 1
    print(f"format: {name}; {len(records)} of {len(lines)} line(s) carry telemetry")
    for r in records:
        fields = " ".join(f"{k}={v}" for k, v in r.as_dict().items()
                          if k not in ("format", "line") and v is not None)
        print(f"line {r.line_no}: {fields}")
    return 0


def show_checkpoint(args: argparse.Namespace) -> int:
    """``lens checkpoint``: what a re-placed job would resume from."""
    from dataclasses import asdict

    from libs.checkpoint_layouts import in_progress, newest, problems, resume_step, scan

    directory = Path(args.dir)
    if not directory.is_dir():
        raise CliError(f"{directory}: not a directory (give the job's checkpoint directory)")
    listing = scan(directory)
    found = newest(listing, world_size=args.world_size)
    doc = {"directory": str(directory.resolve()),
           "newest": asdict(found) if found else None, "resume_step": resume_step(found),
           "in_progress": [asdict(f) for f in in_progress(listing, world_size=args.world_size)],
           "problems": problems(listing, world_size=args.world_size)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if found is None:
        print(f"{directory}: no complete checkpoint (a job would start from scratch)")
    else:
        print(f"newest complete: {found.path} ({found.layout}, step {found.step}); "
              f"resumes at step {doc['resume_step']}")
    for f in doc["in_progress"]:
        print(f"being written: {f['path']} ({f['layout']}, step {f['step']})")
    for problem in doc["problems"]:
        print(f"problem: {problem}")
    return 0 if found is not None else 1


def run(args: argparse.Namespace) -> int:
    if args.lens_verb == "parse":
        return parse_log(args)
    if args.lens_verb == "checkpoint":
        return show_checkpoint(args)
    if args.lens_verb == "silence":
        from cli import lens_silence
        return lens_silence.run(args)
    result = asyncio.run(fetch(args))
    if args.lens_verb == "report" and not args.json:
        from cli.lens_report import render

        out = Path(args.output or f"report-{args.job}.html")
        out.write_text(render(args.job, result))
        print(out)
        return 0
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        show(args, result)
    return 0


async def fetch(args: argparse.Namespace) -> Any:
    bus = await connect(Settings())
    try:
        verb = args.lens_verb
        if verb == "job":
            return await job_data(bus, args.id, args.limit)
        if verb == "gpu-hours":
            return await gpu_hours(bus, args)
        if verb == "report":
            data = await job_data(bus, args.job, 100_000)
            data["timeline"] = await lens_query(bus, "timeline", job=args.job, limit=2000)
            return data
        if verb == "node":
            return {
                "summary": await _first(bus, "node_summary", node=args.id),
                "gpus": await lens_query(bus, "node_gpus", node=args.id, minutes=args.minutes),
                "series": await lens_query(bus, "node_series", node=args.id,
                                           minutes=args.minutes),
                "alerts": await lens_query(bus, "alerts", node=args.id, open_only=1),
            }
        keys = {"job": args.job or "", "node": args.node or "", "limit": args.limit}
        if verb == "alerts":
            return await lens_query(bus, "alerts", open_only=int(args.open), **keys)
        if verb == "logs":
            return await lens_query(bus, "logs", **keys)
        return await lens_query(bus, "timeline", step=args.step, **keys)
    finally:
        await bus.close()


async def gpu_hours(bus: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    window = {"since_ms": time_ms(args.since, "--since"),
              "until_ms": time_ms(args.until, "--until"),
              "workspace": args.workspace or "", "job": args.job or ""}
    if args.by == "workspace":
        return await lens_query(bus, "workspace_gpu_hours", **window)
    return await lens_query(bus, "gpu_hours", limit=args.limit, **window)


async def job_data(bus: Any, job: str, limit: int) -> dict[str, Any]:
    gpus = await lens_query(bus, "job_gpus", job=job)
    return {
        # each GPU it ran on; GPU-hours from the raw rows (the roll-up that
        # gpu-hours reads lags by a minute or two)
        "gpus": gpus,
        "gpu_hours": round(sum(g["gpu_hours"] or 0.0 for g in gpus), 6),
        "summary": await _first(bus, "job_summary", job=job),
        "series": await lens_query(bus, "job_series", job=job, limit=limit),
        "throughput": await lens_query(bus, "job_throughput", job=job),
        "checkpoints": await lens_query(bus, "job_checkpoints", job=job),
        "alerts": await lens_query(bus, "alerts", job=job),
        # lines each rank printed, and what its log rate dropped
        "output": await lens_query(bus, "job_output", job=job),
        # placements, stops, resumes, cancels: the job's lifecycle as events
        "lifecycle": [e for e in await lens_query(bus, "events", job=job, node="", limit=500)
                      if e["type"].startswith("job.") and e["type"] != "job.pending"],
    }


async def _first(bus: Any, name: str, **params: Any) -> dict[str, Any]:
    return (await lens_query(bus, name, **params) or [{}])[0]


# --------------------------------------------------------------------------- text


def show(args: argparse.Namespace, result: Any) -> None:
    verb = args.lens_verb
    if verb == "job":
        s = result["summary"]
        if not s.get("samples") and not result["gpus"] and not result["output"]:
            raise CliError(f"no telemetry for job {args.id!r} yet")
        if s.get("samples"):
            print(f"job {args.id}: {s['ranks']} rank(s), iterations up to "
                  f"{s['last_iteration']}, loss {_num(s['first_loss'])} -> "
                  f"{_num(s['last_loss'])}, {s['checkpoints']} checkpoint file(s), mean "
                  f"throughput {_num(s['mean_throughput'])} samples/s per rank")
        if result["gpus"]:
            print(f"job {args.id}: {len(result['gpus'])} GPU(s), "
                  f"{_num(result['gpu_hours'])} GPU-hours")
            table([gpu_row(g) for g in result["gpus"]],
                  ["node", "gpu", "rank", "attempt", "util", "util_now", "vram", "power",
                   "power_now"],
                  "GPUs (utilisation and power: mean over the job, and now)")
        step = max(1, len(result["series"]) // 12)
        table(result["series"][::step], ["iteration", "loss", "throughput", "step_time_s"],
              "loss curve (sampled)")
        table(result["checkpoints"], ["iteration", "rank", "checkpoint_bytes",
                                      "checkpoint_duration_s", "checkpoint_path"], "checkpoints")
        table(result["alerts"], ["state", "rule", "subject", "opened_at", "message"], "alerts")
        table(result["output"], ["attempt", "rank", "node", "lines", "dropped_lines",
                                 "last_line"],
              f"output (primus-safe logs {args.id}; dropped: over the job's log rate)")
        from cli.explain import summary
        table([{**e, "detail": summary(e["type"], json.loads(e["data"]) if isinstance(
            e["data"], str) else e["data"])} for e in result["lifecycle"]],
            ["time", "type", "detail"], "lifecycle")
    elif verb == "gpu-hours":
        if args.by == "workspace":
            table(result, ["workspace", "jobs", "gpu_hours", "first_time", "last_time"],
                  "GPU-hours per workspace")
        else:
            table(result, ["job", "workspace", "attempts", "gpus", "gpu_hours", "first_time",
                           "last_time"], "GPU-hours per job")
        if not result:
            print("no GPU time of any job in that window", file=sys.stderr)
    elif verb == "node":
        s = result["summary"]
        if not s.get("samples"):
            raise CliError(f"no telemetry for node {args.id!r} yet")
        table([s], list(s), f"node {args.id}")
        table(result["gpus"], ["gpu", "util_pct", "temp_c", "temp_junction_c", "power_w",
                               "power_cap_w", "vram_used_bytes", "vram_total_bytes",
                               "ecc_uncorrectable"], "GPUs (newest readings)")
        table(result["alerts"], ["rule", "subject", "opened_at", "message"], "open alerts")
    elif verb == "alerts":
        table(result, ["state", "severity", "rule", "subject", "opened_at", "closed_at",
                       "message"], "alerts")
    elif verb == "logs":
        table(result, ["time", "service", "level", "node", "job", "message"], "logs")
    else:
        table(result, ["time", "kind", "name", "node", "job", "detail"], "timeline")


def gpu_row(g: dict[str, Any]) -> dict[str, Any]:
    """One GPU of a job as the table shows it (units in the cells)."""
    used, total = g.get("vram_used_bytes"), g.get("vram_total_bytes")
    vram = "-" if used is None else f"{used / 2**30:.1f}" + (
        f"/{total / 2**30:.0f} GiB" if total else " GiB")
    return {**g, "util": _unit(g.get("util_pct"), "%"),
            "util_now": _unit(g.get("util_pct_last"), "%"), "vram": vram,
            "power": _unit(g.get("power_w"), " W"), "power_now": _unit(g.get("power_w_last"), " W")}


def _unit(value: Any, unit: str) -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def table(rows: list[dict[str, Any]], columns: list[str], title: str) -> None:
    """A titled plain table (nothing cut short, one row per line)."""
    if not rows:
        return
    print(f"{title}:")
    print(format_table([{c: _cell(row.get(c)) for c in columns} for row in rows], columns))
    print()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
