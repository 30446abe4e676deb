"""``primus-safe up`` and ``primus-safe demo``: the embedded stack in the
foreground, and the walk-through that proves the thin path end to end:
onboard nodes, train two real data-parallel jobs at once (one reporting
through the SDK, one that knows nothing of the platform and only prints
Megatron's log lines and writes Megatron's checkpoints), kill a node of the
second mid-run, watch failover open a fault and that job resume from its own
newest checkpoint on healthy nodes while the other trains on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from cli.client import CliError, connect, lens_query, read_bucket, submit
from cli.routes import ROUTES as CLI_ROUTES
from libs.bus import Bus
from libs.checkpoint_layouts import Found, discover
from libs.embedded import (
    SCRAPE_TARGETS,
    EmbeddedStack,
    StackBusy,
    StackFileError,
    claim_state_dir,
    lock_state_dir,
)
from libs.events import JobSpec, NodeHeartbeat
from libs.log_formats import builtin_parser
from libs.logs import configure
from libs.records import FAULTS, JOBS, NODES, FaultRecord, JobRecord
from libs.settings import Settings
from libs.specs import load_model

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
    stack = EmbeddedStack(_state_dir(args, ".primus"), nodes=args.nodes,
                          nats_cluster=args.nats_cluster,
                          onboarding_level=args.onboarding_level)
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        servers = "nats-server" if args.nats_cluster == 1 else \
            f"a cluster of {args.nats_cluster} nats-servers"
        with console.status(f"starting {servers}, services and local nodes"):
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
            console.print(f"metrics: every service's /metrics on 127.0.0.1, as Prometheus "
                          f"file_sd targets in {stack.state_dir / SCRAPE_TARGETS}")
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
            try:
                nodes = {n.name: n.state for n in
                         (await read_bucket(bus, NODES, missing_ok=True)).values()}
            except CliError:  # JetStream still starting (a cluster electing its leader)
                return 0
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
    jobs = {"sdk": args.job, "unmodified": args.unmodified_job}
    # Each local node offers one device slot: both gangs at once, and one
    # node more, where the killed node's job moves to.
    need = sum(load_model(path, JobSpec).workers for path in jobs.values()) + 1
    if args.nodes < need:
        raise CliError(f"the demo needs at least {need} nodes (--nodes): one device slot per "
                       "worker of both jobs, and a spare node for the job whose node is killed")
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
        summary = asyncio.run(_demo(stack, jobs["sdk"], jobs["unmodified"]))
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


# The node is killed this many iterations past the job's newest checkpoint,
# halfway to its next one (examples/unmodified/job.yaml saves every 100): a
# crash mid-interval, so work is lost and redone, and the iterations redone
# can be compared with the first time they ran.
KILL_AFTER_ITERATIONS = 50


def _printed_iteration(log: Path) -> int:
    """The newest iteration a rank printed in Megatron's training_log line
    (0 before the first), read from its log file on the node."""
    parser = builtin_parser()
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        parsed = parser.parse(line, "megatron")
        if parsed is not None and parsed.kind == "progress" and parsed.iteration is not None:
            return parsed.iteration
    return 0


async def _demo(stack: EmbeddedStack, sdk_file: str, unmodified_file: str) -> dict[str, Any]:
    """Two jobs at once: ``sdk_file`` reports through the SDK; the
    ``unmodified_file`` one only prints Megatron's lines and writes Megatron's
    checkpoints. A node of the unmodified job is killed mid-interval."""
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
    sdk = await submit(sdk_file)
    unmod = await submit(unmodified_file)
    mark(f"jobs {sdk} (SDK) and {unmod} (unmodified) submitted")
    both = (sdk, unmod)
    bus = await connect(Settings())
    try:
        async def records(*statuses: str) -> dict[str, JobRecord] | None:
            jobs = await read_bucket(bus, JOBS)
            found = {j: jobs[j] for j in both if j in jobs and jobs[j].status in statuses}
            return found if len(found) == len(both) else None

        with console.status("waiting for both gangs to be placed"):
            placed = await _poll(lambda: records("running"), "both jobs to be placed", 60)
        mark(f"placed: {sdk} on {', '.join(placed[sdk].nodes)}, {unmod} on "
             f"{', '.join(placed[unmod].nodes)}; training")
        # Rank 0's node dies: the rendezvous master and the one rank that
        # writes Megatron's checkpoints. The last rank, which prints the
        # training log, lives on, so its lines up to the crash reach Lens.
        slots = placed[unmod].slots
        victim = next(s.node for s in slots if s.rank == 0)
        printer = (stack.state_dir / "jobs" / unmod / f"attempt-{placed[unmod].attempt}"
                   / f"rank-{len(slots) - 1}.log")
        ckpt_dir = stack.state_dir / "checkpoints" / unmod

        async def checkpointed() -> Found | None:
            return discover(ckpt_dir, world_size=len(slots))  # complete ones only

        with console.status(f"training until {unmod}'s first complete checkpoint"):
            ckpt = await _poll(checkpointed, "a checkpoint of the unmodified job", 120,
                               every_s=0.1)
        mark(f"{unmod} saved its checkpoint at iteration {ckpt.step} ({ckpt.layout} layout)")

        async def past_checkpoint() -> int | None:
            newest = await checkpointed()
            printed = _printed_iteration(printer)
            step = newest.step if newest and newest.step else 0
            return printed if printed >= step + KILL_AFTER_ITERATIONS else None

        with console.status("training on past the checkpoint"):
            printed = await _poll(past_checkpoint, "the job to train past its checkpoint", 60,
                                  every_s=0.05)
        killed_at, killed_wall = time.monotonic(), time.time()
        stack.kill_node(victim)
        # What a restart resumes from: the rank that writes saves is dead.
        resumable = await checkpointed()
        mark(f"fault injected: SIGKILL of {victim}'s agent and workers (rank 0 of {unmod}, "
             f"at iteration {printed})")

        async def fault() -> FaultRecord | None:
            # The fault about this kill: on the victim, naming the job, opened
            # after it (a slow agent may have had one while onboarding).
            faults = await read_bucket(bus, FAULTS, missing_ok=True)
            return next((f for f in faults.values() if f.key == victim and unmod in f.jobs
                         and f.opened_at >= killed_wall), None)

        with console.status("waiting for failover to notice"):
            opened = await _poll(fault, "failover to open a fault", 60, every_s=0.1)
        detection_s = time.monotonic() - killed_at
        mark(f"fault opened: {opened.kind} on {victim}")

        with console.status("waiting for the job to resume elsewhere and both to finish"):
            final = await _poll(lambda: records("completed", "failed"),
                                "both jobs to finish", 180)
        mark(", ".join(f"{j} {final[j].status} after {final[j].attempt} attempt(s)"
                       for j in both))

        last: dict[str, Any] = {}

        async def lens_settled() -> dict[str, list[dict[str, Any]]] | None:
            # Every attempt in Lens, and nothing new since the last look: the
            # last lines of a finished job may still be on their way.
            now = {j: await lens_query(bus, "job_attempts", job=j) for j in both}
            ready = all(len(now[j]) >= final[j].attempt for j in both)
            settled = ready and now == last
            last.clear()
            last.update(now)
            return now if settled else None

        await _poll(lens_settled, "Lens to store both jobs' telemetry", 30, every_s=1.0)
        reports = {j: await _job_report(bus, j, placed[j], final[j]) for j in both}

        async def recovered() -> FaultRecord | None:
            fault = (await read_bucket(bus, FAULTS, missing_ok=True)).get(opened.fault_id)
            return fault if fault and fault.timings()["first_step_s"] is not None else None

        fault_record = await _poll(recovered, "failover to time the recovery", 30)
        reports[unmod].update(
            checkpoint_iteration=resumable.step if resumable else None,
            killed_at_iteration=printed,
            resume_step=fault_record.resume_step.get(unmod),
            lost_work_s=fault_record.lost_work_s.get(unmod),
            loss_curve=[[r["iteration"], r["loss"]]
                        for r in await lens_query(bus, "job_series", job=unmod)],
            **await _logs_report(unmod))
        nodes = await read_bucket(bus, NODES)
        events = await lens_query(bus, "event_ids")
    finally:
        await bus.close()
    return {
        "job_status": "completed" if all(final[j].status == "completed" for j in both)
        else "failed",
        "killed_node": victim,
        "detection_s": round(detection_s, 2),
        "recovery_s": fault_record.timings(),
        "fault": {"id": fault_record.fault_id, "kind": fault_record.kind,
                  "jobs": fault_record.jobs, "resume_step": fault_record.resume_step,
                  "lost_work_s": fault_record.lost_work_s},
        "sdk": reports[sdk],
        "unmodified": reports[unmod],
        "node_states": {n.name: n.state for n in nodes.values()},
        "events_stored": len(events),
        "timeline_s": marks,
        "total_s": round(time.monotonic() - t_start, 1),
    }


async def _job_report(bus: Bus, job: str, placed: JobRecord,
                      final: JobRecord) -> dict[str, Any]:
    """One job as Lens and the scheduler saw it (the same shape for both jobs)."""
    attempts = await lens_query(bus, "job_attempts", job=job)
    summary = (await lens_query(bus, "job_summary", job=job))[0]
    return {
        "job": job,
        "job_status": final.status,
        "attempts": final.attempt,
        "first_nodes": placed.nodes,
        "final_nodes": final.nodes,
        "attempt_iterations": [[a["attempt"], a["first_iteration"], a["last_iteration"]]
                               for a in attempts],
        "resumed_at_iteration": attempts[-1]["first_iteration"] if attempts else None,
        "last_iteration": summary["last_iteration"],
        "loss_first": summary["first_loss"],
        "loss_last": summary["last_loss"],
        "telemetry_samples": summary["samples"],
    }


async def _logs_report(job: str) -> dict[str, Any]:
    """What ``primus-safe logs JOB`` shows of the job (the verb itself, run
    as an operator would), read back with Lens's Megatron format: the lines,
    the resume message, and the iterations the last attempt redid with the
    losses each attempt printed for them."""
    shown = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "cli.main", "logs", job, "--json",
                         "--tail", "100000"],
        capture_output=True, text=True, timeout=60)
    if shown.returncode != 0:
        raise CliError(f"primus-safe logs {job} failed: {shown.stderr.strip()[-500:]}")
    rows = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
    parser = builtin_parser()
    losses: dict[int, dict[int, float]] = {}  # attempt -> iteration -> loss
    for row in rows:
        parsed = parser.parse(row["message"], "megatron")
        if parsed and parsed.kind == "progress" and parsed.iteration is not None \
                and "loss" in parsed.values:
            losses.setdefault(row["attempt"], {})[parsed.iteration] = parsed.values["loss"]
    attempts = sorted(losses)
    first, last = attempts[0] if attempts else 0, attempts[-1] if attempts else 0
    redone = sorted(set(losses[first]) & set(losses[last])) if first != last else []
    return {
        "log_lines": len(rows),
        "log_lines_per_attempt": {a: sum(r["attempt"] == a for r in rows)
                                  for a in sorted({r["attempt"] for r in rows})},
        "resume_line": next((r["message"].strip() for r in rows
                             if "successfully loaded checkpoint" in r["message"]), None),
        "redone_iterations": [redone[0], redone[-1]] if redone else None,
        "redone_losses": [[i, losses[first][i], losses[last][i]] for i in redone],
    }


def _print_summary(s: dict[str, Any]) -> None:
    ok = "[green]completed[/]" if s["job_status"] == "completed" else f"[red]{s['job_status']}[/]"
    u, k, r = s["unmodified"], s["sdk"], s["recovery_s"]
    redone = u["redone_losses"]
    if not redone:
        replay = "it redid no iteration that Lens saw the first time"
    elif all(a == b for _, a, b in redone):
        replay = f"the {len(redone)} iterations it redid printed the same losses as before"
    else:
        replay = f"[red]the {len(redone)} iterations it redid printed other losses[/]"
    loaded = "loaded it itself (--load)" if u["resume_line"] else "[red]never said it loaded it[/]"
    console.print(
        f"\n[bold]Summary[/]: both jobs {ok}.\n"
        f"  {u['job']} (no Primus-SaFE code: Megatron-style log lines and checkpoints) ran on "
        f"{', '.join(u['first_nodes'])}; {s['killed_node']}, with its rank 0, was killed at "
        f"iteration {u['killed_at_iteration']};\n"
        f"  failover opened a fault {s['detection_s']} s after the kill: resume from the "
        f"checkpoint at iteration {u['resume_step']}, {u['lost_work_s']} s of work lost. "
        f"Its attempt {u['attempts']} {loaded} and resumed at iteration "
        f"{u['resumed_at_iteration']} on {', '.join(u['final_nodes'])}, reaching "
        f"{u['last_iteration']};\n"
        f"  Lens read its loss curve from {u['log_lines']} log lines: {len(u['loss_curve'])} "
        f"iterations, loss {u['loss_first']:.3f} -> {u['loss_last']:.3f}; {replay}.\n"
        f"  Recovery, from the node's last heartbeat: detected {r['detection_s']} s, "
        f"quarantined {r['mitigation_s']} s, re-placed {r['replacement_s']} s, first training step "
        f"{r['first_step_s']} s.\n"
        f"  {k['job']} (SDK) on {', '.join(k['first_nodes'])} was not on the killed node: "
        f"{k['job_status']} in {k['attempts']} attempt(s), {k['last_iteration']} iterations, "
        f"loss {k['loss_first']:.3f} -> {k['loss_last']:.3f}.\n"
        f"  Lens stored {u['telemetry_samples'] + k['telemetry_samples']} job samples and "
        f"{s['events_stored']} events; node states: {s['node_states']}.\n"
        f"  Total {s['total_s']} s."
    )
