"""``primus-safe bench run``, ``bench report``, ``bench sweep`` and ``bench search``.

``bench run`` asks a node's agent for a level, shows each step as the agent
reports it, and for the standard and full levels waits for the coordinator's
fleet-relative verdict (which may include a retry of the run) before it
prints the figures and checks. ``bench report`` prints the fleet table: every
judged figure of every node against its GPU model's median, worst first.
``bench sweep`` has the coordinator measure nodes side by side (taking turns
where they share a machine) and prints each node's verdict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.status import Status

from cli.client import BUS_DOWN, CliError, connect, read_bucket
from cli.output import load_settings, print_rows
from libs.bus import Bus
from libs.events import BenchRequest, BenchRequestData, BenchResult, check_key
from libs.records import JOBS, NODES
from services.bench.busy import busy_nodes, why_busy
from services.bench.protocol import (
    PROGRESS,
    REPORT,
    SEARCH,
    SWEEP,
    BenchProgress,
    SearchReply,
    SearchRequest,
    SweepReply,
    SweepRequest,
)

console = Console(stderr=True)
# Without word from the agent or the coordinator for this long, stop waiting
# for a verdict and show the agent's own result.
VERDICT_QUIET_S = 20.0


@dataclass
class Watch:
    """What one ``bench run`` has heard so far."""

    request_id: str
    started: float = field(default_factory=time.monotonic)
    heard: float = field(default_factory=time.monotonic)
    agent: BenchResult | None = None
    verdict: BenchResult | None = None
    attempts: int = 0
    seen: set[str] = field(default_factory=set)  # result ids, heard live or read back

    def ours(self, event: BenchResult) -> bool:
        """A result of this run not heard before (the live subscription and
        the read-back after a reconnect can both bring it)."""
        if self.request_id not in (event.data.request_id, event.data.retry_of) \
                or event.id in self.seen:
            return False
        self.seen.add(event.id)
        return True


async def _refuse_busy(bus: Bus, nodes: list[str]) -> None:
    """Bench never disturbs training unless the operator says --force."""
    busy = busy_nodes((await read_bucket(bus, JOBS, missing_ok=True)).values())
    if held := [n for n in nodes if n in busy]:
        raise CliError("; ".join(why_busy(n, busy[n]) for n in held))


async def _run(node: str, level: str, timeout_s: float, status: Status | None,
               force: bool = False) -> Watch:
    bus = await connect(load_settings())
    if not force:
        try:
            await _refuse_busy(bus, [node])
        except CliError:
            await bus.close()
            raise
    request = BenchRequest(source="cli", node=node,
                           data=BenchRequestData(level=level, reason="operator"))  # type: ignore[arg-type]
    watch = Watch(request.id)
    changed = asyncio.Event()

    def show(text: str) -> None:
        if status is not None:
            status.update(f"{level} bench on {node}: {text} "
                          f"({time.monotonic() - watch.started:.0f} s)")

    async def on_result(event: BenchResult) -> None:
        if not watch.ours(event):
            return
        watch.heard = time.monotonic()
        if event.data.judged_by == "coordinator":
            watch.verdict = event
        else:
            watch.agent, watch.attempts = event, max(watch.attempts, event.data.attempt)
            if event.data.attempt > 1:
                show(f"retry finished ({event.data.outcome})")
            else:
                show("measured; waiting for the fleet verdict" if level != "quick" else "done")
        changed.set()

    async def on_progress(msg: Any) -> None:
        try:
            line = BenchProgress.model_validate_json(msg.data)
        except ValueError:
            return
        if line.request_id.startswith(watch.request_id):
            watch.heard = time.monotonic()
            show(("retry: " if "-retry" in line.request_id else "") + line.step)

    async def catch_up(after: int) -> None:
        """Results stored while the connection was down: the live
        subscription misses them, the stream keeps them."""
        with contextlib.suppress(*BUS_DOWN):  # down again: the next reconnect reads them
            for _, event in await bus.stored_after(BenchResult, after, node=node):
                await on_result(event)  # type: ignore[arg-type]

    try:
        # Listen before asking, so a fast agent's answer is not missed.
        subs = [await bus.listen(BenchResult, on_result, node=node),
                await bus.subscribe(PROGRESS, on_progress, node=node)]
        asked = await bus.publish_at(request)
        deadline = time.monotonic() + timeout_s
        drops = bus.link.disconnects
        try:
            while not _finished(watch, level) and (left := deadline - time.monotonic()) > 0:
                if drops != bus.link.disconnects and bus.link.state == "connected":
                    drops = bus.link.disconnects
                    await catch_up(asked)
                    continue
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
            if not _finished(watch, level) and bus.link.state == "connected":
                await catch_up(asked)  # a last look before giving up
        finally:
            for sub in subs:
                await sub.unsubscribe()
    finally:
        await bus.close()
    if watch.agent is None:
        raise CliError(f"no result from {node}'s bench agent within {timeout_s:.0f} s; "
                       f"is it running? (primus-safe health bench-agent --node {node})")
    return watch


def _finished(watch: Watch, level: str) -> bool:
    if watch.verdict is not None:
        return True
    if watch.agent is None:
        return False
    if level == "quick":
        return True
    return time.monotonic() - watch.heard > VERDICT_QUIET_S  # no coordinator answering


def run(args: argparse.Namespace) -> int:
    node = check_key(args.node, "node name")
    with console.status(f"{args.level} bench on {node}: asking its agent") as status:
        watch = asyncio.run(_run(node, args.level, args.timeout, status, args.force))
    final = watch.verdict or watch.agent
    assert final is not None
    d = final.data
    outcome = d.outcome or ("healthy" if d.passed else "failed")
    if args.json:
        print(final.model_dump_json(indent=2))
        return 0 if d.passed else 1
    colour = {"healthy": "green", "degraded": "yellow", "failed": "red"}[outcome]
    judged = "fleet verdict" if watch.verdict is not None else "agent's own checks"
    if watch.verdict is None and args.level != "quick":
        judged += " (no coordinator verdict: is bench-coordinator running?)"
    retried = " after a retry" if watch.attempts > 1 else ""
    console.print(f"{node}: {d.level} [{colour}]{outcome}[/]{retried} on {d.device} "
                  f"x{d.device_count} in {d.duration_s:.1f} s ({judged}) — {d.reason}")
    print_rows([f.model_dump() for f in d.figures], False, ["name", "value", "unit"],
           f"{node} figures", heading=True)
    if d.checks:
        print_rows([c.model_dump() for c in d.checks], False, ["name", "status", "detail"],
               f"{node} checks", heading=True)
    return 0 if d.passed else 1


async def _report() -> list[dict[str, Any]]:
    bus = await connect(load_settings())
    try:
        reply = await bus.ask(REPORT, timeout_s=10)
    except Exception as exc:
        raise CliError(f"bench-coordinator did not answer ({exc!r}); is it running?") from None
    finally:
        await bus.close()
    if not reply.ok:
        raise CliError(f"bench-coordinator could not report: {reply.error}")
    return [row.model_dump() for row in reply.rows]


def report(args: argparse.Namespace) -> int:
    rows = asyncio.run(_report())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    shown = [{**r, "relative": f"{100 * r['relative']:+.1f}%",
              "flagged": "yes" if r["flagged"] else "", "outcome": r.get("outcome") or ""}
             for r in rows]
    print_rows(shown, False, ["node", "level", "gpu_model", "name", "value", "unit", "median",
                          "relative", "flagged", "peers", "outcome"],
           "bench fleet (sorted by deviation from the median, worst first)", heading=True)
    return 0


async def _sweep(nodes: list[str], level: str, turns: bool, timeout_s: float,
                 force: bool = False) -> SweepReply:
    bus = await connect(load_settings())
    try:
        if not nodes:
            nodes = sorted(await read_bucket(bus, NODES))
        if not nodes:
            raise CliError("no nodes: name them with --nodes or register them with bootstrap")
        reply = await _ask_coordinator(bus, SWEEP, SweepRequest(
            nodes=nodes, level=level, turns=turns, force=force), "sweep",  # type: ignore[arg-type]
            timeout_s)
    finally:
        await bus.close()
    assert isinstance(reply, SweepReply)
    return reply


async def _ask_coordinator(bus: Bus, endpoint: Any, request: Any, what: str,
                           timeout_s: float) -> Any:
    """The coordinator's reply to a long request; one line when it did not
    answer or refused."""
    try:
        reply = await bus.ask(endpoint, request, timeout_s=timeout_s)
    except Exception as exc:
        raise CliError(f"bench-coordinator did not finish the {what} ({exc!r}); "
                       "is it running?") from None
    if not reply.ok:
        raise CliError(f"{what} refused: {reply.error}")
    return reply


def sweep(args: argparse.Namespace) -> int:
    """``bench sweep``: the coordinator measures the nodes side by side and
    judges them against each other; nodes that run a job are skipped."""
    nodes = [check_key(n, "node name") for n in (args.nodes or "").split(",") if n]
    with console.status(f"{args.level} sweep of {len(nodes) or 'all'} node(s)"):
        reply = asyncio.run(_sweep(nodes, args.level, args.turns, args.timeout, args.force))
    rows = [{"node": n, **v.model_dump()} for n, v in sorted(reply.verdicts.items())]
    if args.json:
        print(reply.model_dump_json(indent=2))
    else:
        print_rows(rows, False, ["node", "outcome", "score", "retried", "reason"],
                   f"sweep {reply.session} ({reply.seconds:.0f} s)", heading=True)
        for node, why in sorted(reply.skipped.items()):
            console.print(f"[yellow]skipped {node}[/]: {why} (--force to bench it anyway)")
        if reply.missing:
            console.print(f"[red]no result from: {', '.join(reply.missing)}[/]")
    return 0 if all(r["outcome"] != "failed" for r in rows) and not reply.missing else 1


async def _search(nodes: list[str], healthy: list[str] | None, timeout_s: float,
                  force: bool) -> SearchReply:
    bus = await connect(load_settings())
    try:
        reply = await _ask_coordinator(bus, SEARCH, SearchRequest(
            nodes=nodes, healthy=healthy, force=force), "search", timeout_s)
    finally:
        await bus.close()
    assert isinstance(reply, SearchReply)
    return reply


def search(args: argparse.Namespace) -> int:
    """``bench search NODE NODE...``: a collective over these nodes failed;
    split them against healthy partners until the bad one(s) are found."""
    nodes = [check_key(n, "node name") for n in args.nodes]
    if len(nodes) < 2:
        raise CliError("bench search needs at least two nodes (those a failing collective ran on)")
    healthy = [check_key(n, "node name") for n in args.healthy.split(",") if n] \
        if args.healthy else None
    with console.status(f"searching {len(nodes)} nodes for the bad one(s)"):
        reply = asyncio.run(_search(nodes, healthy, args.timeout, args.force))
    if args.json:
        print(reply.model_dump_json(indent=2))
    else:
        for line in reply.log:
            console.print(f"[dim]{line}[/]")
        print(f"bad: {', '.join(reply.bad) or 'none found'}; cleared: "
              f"{', '.join(reply.cleared) or '-'}"
              + (f"; inconclusive: {reply.inconclusive}" if reply.inconclusive else "")
              + f" ({reply.rounds} round(s), {reply.tests} test(s))")
    return 1 if reply.bad else 0


def add_parsers(bsub: Any) -> None:
    """``bench sweep`` and ``bench search`` (``run`` and ``report`` are in cli/main.py)."""
    s = bsub.add_parser("sweep", help="measure nodes side by side and judge them against "
                                      "each other (nodes that run a job are skipped)")
    s.add_argument("--nodes", help="comma-separated (default: every registered node)")
    s.add_argument("--level", choices=["standard", "full"], default="standard")
    s.add_argument("--turns", action="store_true",
                   help="the nodes share hardware (local nodes): measure one at a time")
    s.add_argument("--force", action="store_true", help="also nodes that run a job")
    s.add_argument("--timeout", type=float, default=1800)
    s.add_argument("--json", action="store_true")
    s = bsub.add_parser("search", help="find the bad node(s) of a failing collective by "
                                       "binary split against healthy partners")
    s.add_argument("nodes", nargs="+", help="the nodes the collective ran on")
    s.add_argument("--healthy", help="comma-separated partners known good (default: the "
                                     "coordinator's healthy nodes)")
    s.add_argument("--force", action="store_true", help="also nodes that run a job")
    s.add_argument("--timeout", type=float, default=1800)
    s.add_argument("--json", action="store_true")
