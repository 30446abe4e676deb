"""``primus-safe logs JOB [--rank N] [--attempt A] [--grep RE] [--since T]
[--tail N] [--follow] [--json]``: a job's output, as its workers printed it,
from Lens (every rank of every attempt, whichever node or pod ran it).

Without ``--since`` it shows the newest ``--tail`` lines (like ``kubectl
logs --tail``); ``--follow`` then prints lines as Lens stores them, until
interrupted (a collector that restarts or a bus that blinks meanwhile is
waited for, with one line on stderr). Lines the job's log rate dropped
show as a ``meta`` line saying how many.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from typing import Any

from cli.client import CliError, LensUnanswered, connect, lens_query
from cli.output import load_settings, time_ms
from libs.bus import Bus

FOLLOW_POLL_S = 1.0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("logs", help="a job's output (stdout and stderr of every rank), from Lens")
    s.add_argument("job")
    s.add_argument("--rank", type=int, default=-1, help="only this rank")
    s.add_argument("--attempt", type=int, default=0, help="only this attempt (default: all)")
    s.add_argument("--grep", default="", help="only lines this regular expression (RE2) finds")
    s.add_argument("--since", default=None,
                   help="lines printed since: a duration (10m, 2h, 1d) or a time (ISO 8601)")
    s.add_argument("--tail", type=int, default=200,
                   help="without --since: the newest N lines (default 200)")
    s.add_argument("--limit", type=int, default=10000, help="at most this many lines with --since")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    s.add_argument("--json", action="store_true", help="one JSON object per line")


def render(row: dict[str, Any], *, as_json: bool, many_ranks: bool) -> str:
    if as_json:
        return json.dumps(row, default=str)
    when = str(row["time"]).replace("T", " ")[:23]
    stream = "" if row["stream"] == "stdout" else f" {row['stream']}"
    if not many_ranks and not stream:
        return f"{when} {row['message']}"
    return f"{when} [a{row['attempt']} r{row['rank']}{stream}] {row['message']}"


def run(args: argparse.Namespace) -> int:
    if args.grep:
        try:
            re.compile(args.grep)
        except re.error as exc:
            raise CliError(f"--grep {args.grep!r} is not a regular expression: {exc}") from None
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    bus = await connect(load_settings())
    try:
        return await _print(bus, args)
    finally:
        await bus.close()


async def _print(bus: Bus, args: argparse.Namespace) -> int:
    keys = {"job": args.job, "rank": args.rank, "attempt": args.attempt, "grep": args.grep}
    start = time_ms(args.since, "--since")
    if args.since:
        rows = await lens_query(bus, "worker_logs", since_ms=start, limit=args.limit, **keys)
    else:
        rows = list(reversed(await lens_query(bus, "worker_logs", newest_first=1,
                                              limit=max(args.tail, 0), **keys)))
    many = args.rank < 0
    cursor = max((r["received_ms"] for r in rows), default=0)
    if not rows and not args.follow:
        output = await lens_query(bus, "job_output", job=args.job)
        if not output:
            raise CliError(f"no output of job {args.job} in Lens (no such job, it printed "
                           "nothing yet, or log shipping is off: PRIMUS_WORKER_LOG_SHIP)")
    for row in rows:
        print(render(row, as_json=args.json, many_ranks=many), flush=args.follow)
    if not args.follow:
        return 0
    # Follow by the time lines were stored: a late batch still shows. Lines
    # one insert stored share its time: past the first round the cursor's
    # own millisecond is asked again (and what was printed skipped); the
    # first round starts after it, as lines older than the tail stored in
    # the same insert were left out on purpose.
    cursor = cursor or int(time.time() * 1000) - 2000
    after = cursor
    seen: set[tuple[int, int, int]] = set()
    lost = False
    while True:
        await asyncio.sleep(FOLLOW_POLL_S)
        try:
            rows = await lens_query(bus, "worker_logs", since_ms=start, after_ms=after,
                                    limit=args.limit, **keys)
        except LensUnanswered as exc:
            # A collector being rolled out, or the bus restarting: a follow
            # that runs for days waits for them rather than ending. Lines
            # stored meanwhile come with the next answer (the cursor holds).
            if not lost:
                print(f"primus-safe: {exc}; still following", file=sys.stderr, flush=True)
            lost = True
            continue
        if lost:
            print("primus-safe: lens-collector answers again", file=sys.stderr, flush=True)
            lost = False
        for row in rows:
            key = (row["attempt"], row["rank"], row["seq"])
            if key in seen:
                continue
            print(render(row, as_json=args.json, many_ranks=many), flush=True)
        if rows:
            cursor = max(r["received_ms"] for r in rows)
            seen = {(r["attempt"], r["rank"], r["seq"]) for r in rows
                    if r["received_ms"] == cursor}
        after = cursor - 1
