"""``primus-safe up`` and ``primus-safe demo``: the embedded stack in the
foreground, and the walk-through that proves the thin path end to end:
onboard nodes, train a real DDP job, kill a node mid-run, watch failover
open a fault and the job resume from its checkpoint on healthy nodes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from cli.client import CliError, connect, lens_query, read_bucket, submit
from cli.routes import ROUTES as CLI_ROUTES
from libs.bus import Bus
from libs.embedded import (
    EmbeddedStack,
    StackBusy,
    StackFileError,
    claim_state_dir,
    lock_state_dir,
)
from libs.events import NodeHeartbeat
from libs.logs import configure
from libs.records import FAULTS, JOBS, NODES, FaultRecord, JobRecord
from libs.sdk import latest_complete_checkpoint
from libs.settings import Settings

console = Console(stderr=True)


def _state_dir(args: argparse.Namespace, default: str) -> Path:
    settings = Settings()
    configured = settings.state_dir if "state_dir" in settings.model_fields_set else None
    return Path(args.state_dir or configured or default).resolve()


def up(args: argparse.Namespace) -> int:
    """Run the stack in the foreground and keep it up: a child that dies is
    restarted with backoff (logged and counted in stack.json); Ctrl-C or
    SIGTERM stops everything, training workers included."""
    configure("up")  # the supervisor's lines: JSON on stderr, like every service
    stack = EmbeddedStack(_state_dir(args, ".primus"), nodes=args.nodes)
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        with console.status("starting nats-server, services and local nodes"):
            try:
                stack.start()
            except (StackBusy, StackFileError) as exc:
                raise CliError(str(exc)) from None
            if stack.cleaned:
                console.print(f"[yellow]cleaned up[/] after a dead stack in {stack.state_dir}: "
                              f"killed pids {', '.join(map(str, stack.cleaned))}")
            ready = asyncio.run(_wait_nodes_ready(stack, timeout_s=120, stop=lambda: stop))
        assert stack.nats is not None
        if not stop:
            console.print(f"[green]up[/]: {ready} nodes ready; bus {stack.nats.public_url}; "
                          f"state {stack.state_dir}. In another shell: primus-safe submit "
                          "examples/job.yaml; primus-safe jobs. Ctrl-C stops.")
        while not stop:
            time.sleep(0.5)
            for name in stack.supervise():
                console.print(f"[yellow]restarted[/] {name} (restart "
                              f"{stack.restarts[name].restarts}); its log: "
                              f"{stack.state_dir / 'logs' / f'{name}.log'}")
    finally:
        if stack.nats is not None:
            with console.status("stopping the stack"):
                stack.stop()
    return 0


async def _poll(fn: Any, what: str, timeout_s: float, every_s: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await fn()
        if result:
            return result
        await asyncio.sleep(every_s)
    raise CliError(f"timed out after {timeout_s:.0f} s waiting for {what}")


async def _wait_nodes_ready(stack: EmbeddedStack, timeout_s: float,
                            stop: Callable[[], bool] = lambda: False) -> int:
    """Wait until every node is ready *and alive now*: its KV record says
    ready and its agent, the process this stack started, has sent a heartbeat
    (the heartbeat carries the agent's pid). KV state alone may be a previous
    run's. Returns how many nodes are ready, -1 when ``stop`` said to stop."""
    bus = await _stack_bus(stack)
    beating: set[tuple[str, int]] = set()

    async def on_beat(event: NodeHeartbeat) -> None:
        beating.add((event.node, event.data.pid))

    sub = await bus.listen(NodeHeartbeat, on_beat)
    try:
        def live() -> set[str]:
            return {n for n in stack.node_names if (n, stack.procs[f"agent-{n}"].pid) in beating}

        async def ready() -> int:
            if stop():
                return -1  # Ctrl-C while starting: up stops, no error
            stack.supervise()  # a child that dies while we wait is restarted too
            nodes = {n.name: n.state for n in
                     (await read_bucket(bus, NODES, missing_ok=True)).values()}
            alive = live()
            done = [n for n in stack.node_names if nodes.get(n) == "ready" and n in alive]
            return len(done) if len(done) == len(stack.node_names) else 0
        return int(await _poll(ready, "every node to pass onboarding and send a heartbeat",
                               timeout_s))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        await bus.close()


async def _stack_bus(stack: EmbeddedStack) -> Bus:
    assert stack.nats is not None
    deadline = time.monotonic() + 10
    while True:
        try:
            return await Bus.connect(stack.nats.url, "demo", token=stack.nats.token,
                                     routes=CLI_ROUTES)
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def demo(args: argparse.Namespace) -> int:
    state = _state_dir(args, ".primus/demo")
    if state.exists():
        # A demo starts from nothing, but never under a live stack: refuse
        # then, and kill what a dead one left before wiping its directory.
        try:
            # A corrupt stack.json here is wiped: the lock says no one owns it.
            with contextlib.closing(lock_state_dir(state)), \
                    contextlib.suppress(StackFileError):
                claim_state_dir(state)
        except StackBusy as exc:
            raise CliError(str(exc)) from None
        shutil.rmtree(state)
    stack = EmbeddedStack(state, nodes=args.nodes)
    os.environ["PRIMUS_STATE_DIR"] = str(state)
    os.environ.pop("PRIMUS_NATS_URL", None)
    try:
        summary = asyncio.run(_demo(stack, args.job))
    finally:
        with console.status("stopping the stack"):
            codes = stack.stop()
    # The killed node's agent died by SIGKILL; everything else must stop cleanly.
    killed = f"agent-{summary.get('killed_node')}"
    summary["exit_codes"] = codes
    summary["clean_shutdown"] = all(code == 0 for name, code in codes.items() if name != killed)
    if stack.stragglers:  # killed at stop: what each was doing
        summary["stragglers"] = stack.stragglers
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(summary)
    return 0 if summary["job_status"] == "completed" else 1


async def _demo(stack: EmbeddedStack, job_file: str) -> dict[str, Any]:
    t_start = time.monotonic()
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = round(time.monotonic() - t_start, 2)
        console.print(f"[dim]{marks[name]:6.1f}s[/] {name}")

    with console.status("starting nats-server, lens-collector, scheduler, failover, bootstrap "
                        f"and {stack.nodes} local nodes"):
        stack.start()
        mark("stack started")
        await _wait_nodes_ready(stack, timeout_s=120)
    mark(f"{stack.nodes} nodes registered, benchmarked and ready")
    job = await submit(job_file)
    mark(f"job {job} submitted")
    bus = await connect(Settings())
    try:
        async def job_record() -> JobRecord | None:
            return (await read_bucket(bus, JOBS)).get(job)

        async def running() -> JobRecord | None:
            record = await job_record()
            return record if record and record.status == "running" else None

        with console.status("waiting for the gang to be placed"):
            record = await _poll(running, "the job to be placed", 60)
        first_nodes = record.nodes
        mark(f"placed on {', '.join(first_nodes)}; training")
        ckpt_dir = stack.state_dir / "checkpoints" / job
        workers = len(record.slots)

        async def checkpointed() -> Any:
            return latest_complete_checkpoint(ckpt_dir, workers)

        with console.status("training until the first complete checkpoint"):
            ckpt = await _poll(checkpointed, "a checkpoint", 120, every_s=0.1)
        mark(f"checkpoint at iteration {ckpt.iteration}")
        victim = first_nodes[-1]
        killed_at, killed_wall = time.monotonic(), time.time()
        stack.kill_node(victim)
        mark(f"fault injected: SIGKILL of {victim}'s agent and workers")

        async def fault() -> FaultRecord | None:
            # The fault about this kill: on the victim, naming the job, opened
            # after it (a slow agent may have had one while onboarding).
            faults = await read_bucket(bus, FAULTS, missing_ok=True)
            return next((f for f in faults.values() if f.key == victim and job in f.jobs
                         and f.opened_at >= killed_wall), None)

        with console.status("waiting for failover to notice"):
            opened = await _poll(fault, "failover to open a fault", 60, every_s=0.1)
        detection_s = time.monotonic() - killed_at
        mark(f"fault opened: {opened.kind} on {victim}")

        async def finished() -> JobRecord | None:
            record = await job_record()
            return record if record and record.status in ("completed", "failed") else None

        with console.status("waiting for the job to resume elsewhere and finish"):
            final = await _poll(finished, "the job to finish", 150)
        mark(f"job {final.status} after {final.attempt} attempt(s)")

        async def lens_has_it() -> list[dict[str, Any]] | None:
            rows = await lens_query(bus, "job_attempts", job=job)
            return rows if len(rows) >= final.attempt else None

        attempts = await _poll(lens_has_it, "Lens to store the job's telemetry", 30)
        summary = (await lens_query(bus, "job_summary", job=job))[0]
        nodes = await read_bucket(bus, NODES)
        events = await lens_query(bus, "event_ids")

        async def recovered() -> FaultRecord | None:
            fault = (await read_bucket(bus, FAULTS, missing_ok=True)).get(opened.fault_id)
            return fault if fault and fault.first_step_at else None

        timings = (await _poll(recovered, "failover to time the recovery", 30)).timings()
    finally:
        await bus.close()
    return {
        "job": job,
        "job_status": final.status,
        "attempts": final.attempt,
        "first_nodes": first_nodes,
        "final_nodes": final.nodes,
        "killed_node": victim,
        "checkpoint_iteration": ckpt.iteration,
        "resumed_at_iteration": attempts[-1]["first_iteration"],
        "last_iteration": summary["last_iteration"],
        "loss_first": summary["first_loss"],
        "loss_last": summary["last_loss"],
        "detection_s": round(detection_s, 2),
        "recovery_s": timings,
        "node_states": {n.name: n.state for n in nodes.values()},
        "events_stored": len(events),
        "telemetry_samples": summary["samples"],
        "timeline_s": marks,
        "total_s": round(time.monotonic() - t_start, 1),
    }


def _print_summary(s: dict[str, Any]) -> None:
    ok = "[green]completed[/]" if s["job_status"] == "completed" else f"[red]{s['job_status']}[/]"
    r = s["recovery_s"]
    console.print(
        f"\n[bold]Summary[/]: job {s['job']} {ok} in {s['attempts']} attempt(s).\n"
        f"  ran on {', '.join(s['first_nodes'])}; {s['killed_node']} was killed after the "
        f"checkpoint at iteration {s['checkpoint_iteration']};\n"
        f"  failover opened a fault {s['detection_s']} s after the kill; the job resumed at "
        f"iteration {s['resumed_at_iteration']} on {', '.join(s['final_nodes'])} and reached "
        f"{s['last_iteration']} (loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}).\n"
        f"  Recovery, from the node's last heartbeat: detected {r['detection_s']} s, "
        f"quarantined {r['mitigation_s']} s, re-placed {r['replacement_s']} s, first training step "
        f"{r['first_step_s']} s.\n"
        f"  Lens stored {s['telemetry_samples']} job samples and {s['events_stored']} events; "
        f"node states: {s['node_states']}.\n  Total {s['total_s']} s."
    )
