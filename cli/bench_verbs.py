"""``primus-safe bench run`` and ``bench report``."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from rich.console import Console

from cli.client import CliError, connect
from cli.main import _print, _settings
from libs.bus import QUERY_SUBJECT
from libs.events import BenchRequest, BenchRequestData, BenchResult, check_key, parse_event

console = Console(stderr=True)


async def _run(node: str, level: str, timeout_s: float) -> BenchResult:
    bus = await connect(_settings())
    try:
        request = BenchRequest(source="cli", node=node,
                               data=BenchRequestData(level=level, reason="operator"))  # type: ignore[arg-type]
        result: asyncio.Future[BenchResult] = asyncio.get_running_loop().create_future()

        async def on_result(msg: Any) -> None:
            event = parse_event(msg.data)
            if (isinstance(event, BenchResult) and event.data.request_id == request.id
                    and not result.done()):
                result.set_result(event)

        # Listen before asking, so a fast agent's answer is not missed.
        sub = await bus.nc.subscribe(f"safe.bench.{node}.result", cb=on_result)
        await bus.publish(request)
        try:
            return await asyncio.wait_for(result, timeout_s)
        except TimeoutError:
            raise CliError(f"no result from {node}'s bench agent within {timeout_s:.0f} s; "
                           f"is it running? (primus-safe health bench-agent --node {node})"
                           ) from None
        finally:
            await sub.unsubscribe()
    finally:
        await bus.close()


def run(args: argparse.Namespace) -> int:
    node = check_key(args.node, "node name")
    with console.status(f"{args.level} bench on {node}"):
        result = asyncio.run(_run(node, args.level, args.timeout))
    d = result.data
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        verdict = "[green]passed[/]" if d.passed else "[red]failed[/]"
        console.print(f"{node}: {d.level} {verdict} on {d.device} x{d.device_count} "
                      f"in {d.duration_s:.1f} s — {d.reason}")
        _print([f.model_dump() for f in d.figures], False, ["name", "value", "unit"], node)
    return 0 if d.passed else 1


async def _report() -> list[dict[str, Any]]:
    bus = await connect(_settings())
    try:
        reply = await bus.request(QUERY_SUBJECT.format(name="bench.report"), timeout_s=10)
    except Exception as exc:
        raise CliError(f"bench-coordinator did not answer ({exc!r}); is it running?") from None
    finally:
        await bus.close()
    return reply["rows"]


def report(args: argparse.Namespace) -> int:
    rows = asyncio.run(_report())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    shown = [{**r, "relative": f"{100 * r['relative']:+.1f}%", "flagged": "yes" if r["flagged"]
              else ""} for r in rows]
    _print(shown, False, ["node", "gpu_model", "name", "value", "unit", "median", "relative",
                          "flagged", "peers"], "bench fleet (worst first)")
    return 0
