"""``primus-safe node cordon|uncordon|drain NODE`` and ``primus-safe fault
close FAULT``: an operator's hold on a node, and their word on a fault.

Like the job verbs, each reads the record first (an unknown node or fault is
one line and exit 1; asking for what already holds is not an error),
publishes the request as an event with who asked and why, and waits until
its owner has carried it out: bootstrap for a node (a drain until no job
runs there any more), failover for a fault.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from cli.client import CliError, connect, state_bucket, wait_for
from cli.job_verbs import operator
from cli.output import load_settings
from libs.bus import Bus
from libs.events import (
    Event,
    FaultCloseData,
    FaultCloseRequested,
    NodeCommandData,
    NodeCordonRequested,
    NodeDrainRequested,
    NodeUncordonRequested,
    check_key,
)
from libs.records import FAULTS, JOBS, NODES

NODE_VERBS: dict[str, tuple[type[Event], str]] = {
    "cordon": (NodeCordonRequested, "place no new job on the node (running ones stay)"),
    "uncordon": (NodeUncordonRequested, "let the scheduler place jobs on the node again"),
    "drain": (NodeDrainRequested, "cordon the node and move its jobs away (checkpointed, "
                                  "no retry spent)"),
}


def _common(s: argparse.ArgumentParser) -> None:
    s.add_argument("--reason", default="", help="why, recorded with the event")
    s.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once the request is on the bus")
    s.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for it to be carried out (default 300)")
    s.add_argument("--json", action="store_true")


def add_parsers(sub: Any) -> None:
    node = sub.add_parser("node", help="an operator's hold on a node: cordon, uncordon, drain")
    nsub = node.add_subparsers(dest="node_verb", required=True)
    for verb, (_, help_text) in NODE_VERBS.items():
        s = nsub.add_parser(verb, help=help_text)
        s.add_argument("node")
        _common(s)
    fault = sub.add_parser("fault", help="close a fault (its node comes back through bench)")
    fsub = fault.add_subparsers(dest="fault_verb", required=True)
    s = fsub.add_parser("close", help="close a fault; a quarantined node is benched again now")
    s.add_argument("fault")
    _common(s)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CliError(f"--timeout {args.timeout:g}: write a positive number of seconds")
    if args.verb == "node":
        try:
            check_key(args.node, "node name")
        except ValueError as exc:
            raise CliError(str(exc)) from None
        act = node_act(args.node_verb, args.node, reason=args.reason, wait=args.wait,
                       timeout_s=args.timeout)
    else:
        act = close_fault(args.fault, reason=args.reason, wait=args.wait,
                          timeout_s=args.timeout)
    result = asyncio.run(act)
    print(json.dumps(result, indent=2) if args.json else result["message"])
    return 0


async def _on_bus(fn: Callable[[Bus], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    bus = await connect(load_settings())
    try:
        return await fn(bus)
    finally:
        await bus.close()


async def node_act(action: str, node: str, *, reason: str = "", wait: bool = True,
                   timeout_s: float = 300.0) -> dict[str, Any]:
    async def act(bus: Bus) -> dict[str, Any]:
        nodes = await state_bucket(bus, NODES)
        jobs = await state_bucket(bus, JOBS)
        record = await nodes.get(node)
        if record is None:
            raise CliError(f"node {node} not found (primus-safe nodes lists them)")

        async def running_there() -> list[str]:
            return sorted(j.id for j in (await jobs.load()).values()
                          if j.holds_gpus and node in j.nodes)

        want = action != "uncordon"
        if record.cordoned == want and (action != "drain" or not await running_there()):
            state = "cordoned" if want else "not cordoned"
            return {"node": node, "action": action, "changed": False, "state": record.state,
                    "cordoned": record.cordoned,
                    "message": f"node {node} is already {state}"
                               + (" and drained" if action == "drain" else "")}
        moved = await running_there() if action == "drain" else []
        kind = NODE_VERBS[action][0]
        await bus.publish(kind(source="cli", node=node,  # type: ignore[call-arg]
                               data=NodeCommandData(by=operator(), reason=reason)))
        if not wait:
            return {"node": node, "action": action, "changed": True, "state": record.state,
                    "cordoned": want, "message": f"node {node}: {action} requested"}

        async def done() -> str | None:
            now = await nodes.get(node)
            if now is None:
                return f"node {node} is gone (removed)"
            if now.cordoned != want:
                return None
            if action == "drain":
                left = await running_there()
                if left:
                    return None
                return f"node {node} drained" + (f": moved {', '.join(moved)}" if moved else "")
            return f"node {node} {'cordoned' if want else 'uncordoned'}"

        def late() -> str:
            return (f"node {node}: {action} requested {timeout_s:g} s ago and not done yet "
                    "(is bootstrap running? a drain waits for the jobs to stop); "
                    "primus-safe nodes shows where it stands")

        said = await wait_for(done, timeout_s, late)
        return {"node": node, "action": action, "changed": True, "state": record.state,
                "cordoned": want, "moved": moved, "message": said}

    return await _on_bus(act)


async def close_fault(fault_id: str, *, reason: str = "", wait: bool = True,
                      timeout_s: float = 300.0) -> dict[str, Any]:
    async def act(bus: Bus) -> dict[str, Any]:
        faults = await state_bucket(bus, FAULTS)
        try:
            record = await faults.get(fault_id)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if record is None:
            raise CliError(f"fault {fault_id} not found (primus-safe faults lists them)")
        if record.status == "closed":
            return {"fault": fault_id, "changed": False, "status": "closed",
                    "message": f"fault {fault_id} is already closed"}
        await bus.publish(FaultCloseRequested(source="cli", node=record.key, data=FaultCloseData(
            fault_id=fault_id, by=operator(), reason=reason)))
        if not wait:
            return {"fault": fault_id, "changed": True, "status": record.status,
                    "message": f"fault {fault_id}: close requested"}

        async def done() -> str | None:
            now = await faults.get(fault_id)
            if now is None or now.status != "closed":
                return None
            back = (f"; node {record.key} comes back through bench"
                    if record.scope == "node" else "")
            return f"fault {fault_id} closed{back}"

        def late() -> str:
            return (f"fault {fault_id}: close requested {timeout_s:g} s ago and still "
                    f"{record.status} (is failover running?)")

        said = await wait_for(done, timeout_s, late)
        return {"fault": fault_id, "changed": True, "status": "closed", "message": said}

    return await _on_bus(act)
