"""Chaos on the embedded stack: a 2-node training job with checkpoints runs
on 4 local nodes while a seeded schedule SIGKILLs a node (agent and
workers), one worker of the job, the scheduler (restarted), nats-server
itself (restarted on the same port and store, so JetStream state persists),
the bench agent of one of the job's nodes (SIGTERM or SIGKILL, then
restarted: its workers run on) and one of the other services (failover, the
Lens collector, the bench coordinator or bootstrap, restarted); and an
operator upgrades the platform (every service and agent stopped and started
again at once), stops and resumes the job, drains one of its nodes and,
while nats-server is down, lists the jobs, through the real CLI (each
command must succeed). Afterwards the invariants in ``invariants`` must hold:
the job completes, the history table has every control event exactly once,
no node is out of service without an open fault, no node is evacuated for
its agent's restart, nothing is placed or run twice, no worker is placed on
a drained node, no retry is spent but by a strike that killed a worker, and
every attempt resumed from the newest complete checkpoint.

Seeds: ``PRIMUS_CHAOS_SEEDS=1,2,3`` (default ``1``), kills per run:
``PRIMUS_CHAOS_KILLS`` (default 9, one of each kind). A failure names its
seed, and ``PRIMUS_CHAOS_SEEDS=<seed> pytest tests/chaos`` replays the same
schedule (the timing of the stack itself is not seeded: a replay hits the
same kinds, order, pauses and outages, not always the same instant).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.embedded import SERVICES, EmbeddedStack
from libs.events import Event, JobSpec, JobSubmitted, JobSubmittedData, parse_event
from libs.sdk import latest_complete_checkpoint
from libs.settings import Settings
from tests.chaos.invariants import (
    AttemptStart,
    agent_violations,
    drain_violations,
    history_violations,
    placement_violations,
    process_violations,
    quarantine_violations,
    resume_violations,
    retry_violations,
)
from tests.chaos.schedule import KINDS, Kill, plan_kills
from tests.helpers import ROOT, bucket, run_cli, stack_cli_env, trouble

KILLS = int(os.environ.get("PRIMUS_CHAOS_KILLS", str(len(KINDS))))
# Long enough that every strike finds the job still training, short enough
# not to train on long after the last one: the workers keep a fixed pace (a
# step takes at least STEP_S, so a run lasts as long on a fast machine as on
# a slow one), and a strike costs the job some seconds of it (its pause, an
# outage, a restart from the last checkpoint).
STEP_S, CHECKPOINT_INTERVAL = 0.02, 20
ITERATIONS = int(3.0 / STEP_S) * max(KILLS, 2)
JOB_BOUND_S = 120.0 + 30.0 * KILLS  # from submission to completion, strikes included
pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(JOB_BOUND_S + 240)]

SEEDS = [int(s) for s in os.environ.get("PRIMUS_CHAOS_SEEDS", "1").split(",") if s.strip()]
NODES, WORKERS = 4, 2
# The services a "service" strike picks from; the scheduler has its own kind.
OTHERS = [s for s in SERVICES if s != "scheduler"]
WORKER = Path(__file__).with_name("chaos_worker.py")
RESUMED = re.compile(r"resumed from checkpoint at iteration (\d+)")
DONE = re.compile(r"done: \d+ iterations \(from (\d+)\)")


async def poll(fn: Callable[[], Awaitable[Any]], what: str, timeout: float,
               every: float = 0.3) -> Any:
    """Until ``fn`` returns something true; a bus that is down is retried."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if result := await fn():
                return result
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


async def lens(bus: Bus, query: str, **params: object) -> list[dict[str, Any]]:
    reply = await bus.request("safe.query.lens.query", {"query": query, "params": params},
                              timeout_s=20)
    assert reply["ok"], reply
    return [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]


class Checkpoints:
    """Watches the job's checkpoint dir: when each step was first complete."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: dict[int, float] = {}

    def newest(self) -> int:
        found = latest_complete_checkpoint(self.directory, WORKERS)
        return found.iteration if found else 0

    async def watch(self) -> None:
        while True:
            now = time.time()
            for step_dir in self.directory.glob("step-*"):
                step = int(step_dir.name.removeprefix("step-"))
                if step not in self.seen and all(
                        (step_dir / f"rank-{r}.pt").exists() for r in range(WORKERS)):
                    self.seen[step] = now
            await asyncio.sleep(0.1)

    def complete_at(self) -> dict[int, float]:
        """The earlier of first seen and the files' own times (a later
        attempt may rewrite a step, which only makes its files newer)."""
        out = dict(self.seen)
        for step in out:
            files = [self.directory / f"step-{step:08d}" / f"rank-{r}.pt" for r in range(WORKERS)]
            with contextlib.suppress(FileNotFoundError):
                out[step] = min(out[step], max(f.stat().st_mtime for f in files))
        return out


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_kills_keep_the_invariants(seed: int, tmp_path: Path) -> None:
    kills = plan_kills(seed, KILLS, spare_nodes=NODES - WORKERS)
    print(f"chaos seed {seed} (replay: PRIMUS_CHAOS_SEEDS={seed} PRIMUS_CHAOS_KILLS={KILLS} "
          f"pytest tests/chaos): {kills}")
    stack = EmbeddedStack(tmp_path / "stack", nodes=NODES).start()
    log: list[str] = []
    try:
        found = asyncio.run(_run(stack, seed, kills, tmp_path, log))
    except Exception as exc:
        raise AssertionError(f"chaos seed {seed} failed: {exc}; timeline {log}; logs in "
                             f"{stack.state_dir / 'logs'}"
                             f"\n{trouble(stack.state_dir / 'logs')}") from exc
    finally:
        stack.stop()
    print(f"chaos seed {seed} timeline: {log}")
    assert not found, (f"chaos seed {seed} broke invariants:\n  " + "\n  ".join(found)
                       + f"\ntimeline {log}")


async def _run(stack: EmbeddedStack, seed: int, kills: list[Kill], tmp_path: Path,
               log: list[str]) -> list[str]:
    assert stack.nats is not None
    t0 = time.monotonic()

    def note(text: str) -> None:
        log.append(f"{time.monotonic() - t0:.1f}s {text}")

    bus = await Bus.connect(stack.nats.url, "chaos", token=stack.nats.token)
    job = f"chaos-{seed}"
    marker = tmp_path / "started.txt"
    ckpts = Checkpoints(stack.state_dir / "checkpoints" / job)
    watcher = asyncio.create_task(ckpts.watch())
    try:
        async def all_ready() -> bool:
            nodes = await bucket(bus, "nodes")
            return len(nodes) == NODES and all(n["state"] == "ready" for n in nodes.values())

        await poll(all_ready, "every node to pass onboarding", 150)
        note("nodes ready")
        spec = JobSpec(name=job, workers=WORKERS, gpus_per_worker=1, max_retry=10,
                       checkpoint_interval=CHECKPOINT_INTERVAL, workdir=str(ROOT),
                       command=["python", str(WORKER), str(marker),
                                "--iterations", str(ITERATIONS),
                                "--min-step-s", str(STEP_S)])
        await bus.publish(JobSubmitted(source="chaos", job=job, data=JobSubmittedData(spec=spec)))
        submitted = time.monotonic()

        async def record() -> dict[str, Any]:
            return json.loads((await (await bus.kv("jobs")).get(job)).value)

        struck = Struck()
        mark = 0
        for kill in kills:
            async def progressed(mark: int = mark) -> bool:
                r = await record()
                return r["status"] in ("completed", "failed") or ckpts.newest() > mark

            if not kill.hurry:
                await poll(progressed, f"progress past step {mark} before the {kill.kind} kill",
                           JOB_BOUND_S - (time.monotonic() - submitted), every=0.1)
            if (await poll(record, "the job record", 30))["status"] in ("completed", "failed"):
                note(f"job ended before the {kill.kind} kill")
                break
            await asyncio.sleep(kill.delay_s)
            mark = ckpts.newest()
            current = await poll(record, "the job record", 30)
            note(f"{kill.kind} strike at step {mark}, attempt {current['attempt']}: "
                 + await _kill(bus, stack, kill, job, current, struck))
        # What the operator's commands said; each failure is a violation.
        for what, task in struck.commands:
            at, said = await task
            note(f"{what}, done at {at - t0:.1f}s: {said}")
        final = await poll(_ended(record), f"job {job} to end",
                           JOB_BOUND_S - (time.monotonic() - submitted))
        note(f"job {final['status']} after {final['attempt']} attempt(s)")
        assert final["status"] == "completed", f"job {final['status']}: {final['reason']}"
        return await _check(bus, stack, job, final, ckpts, marker, struck)
    finally:
        watcher.cancel()
        await bus.close()


def _ended(record: Callable[[], Awaitable[dict[str, Any]]]) -> Callable[[], Awaitable[Any]]:
    async def ended() -> dict[str, Any] | None:
        r = await record()
        return r if r["status"] in ("completed", "failed") else None
    return ended


@dataclass
class Struck:
    """What the strikes took: nodes killed, nodes whose agent alone was
    restarted, nodes drained, and how many strikes killed workers (the only
    ones that may spend a retry)."""

    killed: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    failing_strikes: int = 0
    announced: bool = False  # an agent stopped cleanly, saying when it would be back
    # The operator's commands under way: what, and (when it was done, what it said).
    commands: list[tuple[str, asyncio.Task[tuple[float, str]]]] = field(default_factory=list)

    def command(self, what: str, act: Awaitable[str]) -> None:
        async def timed() -> tuple[float, str]:
            said = await act
            return time.monotonic(), said

        self.commands.append((what, asyncio.create_task(timed())))

    def live(self, stack: EmbeddedStack) -> list[str]:
        return [n for n in stack.node_names if n not in self.killed + self.drained]

    def running_on(self, record: dict[str, Any]) -> list[str]:
        """The job's nodes that have not been killed."""
        return [s["node"] for s in record["slots"] if s["node"] not in self.killed]


async def _kill(bus: Bus, stack: EmbeddedStack, kill: Kill, job: str, record: dict[str, Any],
                struck: Struck) -> str:
    """Do one strike of the schedule; says what it hit."""
    if kill.kind == "agent":
        # Its point is a node whose workers run on: wait for the job to run.
        deadline = time.monotonic() + 30
        while not record["slots"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            record = json.loads((await (await bus.kv("jobs")).get(job)).value)
        nodes = struck.running_on(record)
        if record["status"] != "running" or not nodes:
            return "the job does not run now: no agent to restart"
        node = kill.choose(nodes)
        # A crash or a clean stop (a DaemonSet rollout), a fair coin on the seed.
        sig = signal.SIGKILL if kill.pick < 0.75 else signal.SIGTERM
        await _stop(stack, [f"agent-{node}"], sig)
        struck.restarted.append(node)
        struck.announced |= sig == signal.SIGTERM
        await asyncio.sleep(kill.down_s)
        stack.restart(f"agent-{node}")
        return f"{node}'s agent {sig.name} and down for {kill.down_s} s"
    if kill.kind == "node":
        # The job's node; between attempts, any live node (it may be next).
        node = kill.choose([s["node"] for s in record["slots"]] or struck.live(stack))
        struck.killed.append(node)
        struck.failing_strikes += 1  # its workers, or the next attempt's placed there
        return f"{node} dies (workers {stack.kill_node(node)})"
    if kill.kind == "worker":
        workers = {}
        for pid_file in (stack.state_dir / "pids").glob("*/[0-9]*"):
            with contextlib.suppress(FileNotFoundError, ValueError):
                j, attempt, rank = pid_file.read_text().split()
                if j == job and int(attempt) == record["attempt"]:
                    workers[f"{pid_file.parent.name}/{rank}/{pid_file.name}"] = int(pid_file.name)
        if not workers:
            return "no worker of the current attempt to kill"
        target = kill.choose(list(workers))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(workers[target], signal.SIGKILL)
        struck.failing_strikes += 1
        return f"worker node/rank/pid {target} killed"
    if kill.kind == "stop":
        # An operator's command waits until it is carried out, and the next
        # strike does not wait for it: a service may die under it.
        async def stop_then_resume() -> str:
            said = await _operator(stack, "stop", job, "--reason", "chaos: maintenance")
            if said is None:
                return "the job ended before the stop"
            await asyncio.sleep(kill.down_s)
            again = await _operator(stack, "resume", job)
            return f"{said}; {kill.down_s} s later {again or 'the job had ended'}"

        struck.command("stop and resume", stop_then_resume())
        return f"stop requested (resume {kill.down_s} s after it is done)"
    if kill.kind == "drain":
        # The job's node; between attempts, any live node (it may be next).
        node = kill.choose(struck.running_on(record) or struck.live(stack))
        struck.drained.append(node)

        async def drain() -> str:
            said = await _operator(stack, "node", "drain", node, "--reason",
                                   "chaos: maintenance")
            return said or "the job ended before the drain"

        struck.command(f"drain of {node}", drain())
        return f"drain of {node} requested"
    if kill.kind == "upgrade":
        # `helm upgrade` of the whole platform, at its harshest: every
        # service and every live agent stopped cleanly at once, then started
        # again; the workers run on.
        agents = [f"agent-{n}" for n in stack.node_names if n not in struck.killed]
        await _stop(stack, [*SERVICES, *agents], signal.SIGTERM)
        struck.restarted += [a.removeprefix("agent-") for a in agents]
        struck.announced = True
        await asyncio.sleep(kill.down_s)
        for name in [*SERVICES, *agents]:
            stack.restart(name)
        return f"every service and agent stopped, back after {kill.down_s} s"
    if kill.kind in ("scheduler", "service"):
        name = "scheduler" if kill.kind == "scheduler" else kill.choose(OTHERS)
        stack.kill(name)
        await asyncio.sleep(kill.down_s)
        stack.restart(name)
        return f"{name} down for {kill.down_s} s"
    assert stack.nats is not None
    stack.nats.kill()
    # An operator looks at the jobs meanwhile: the CLI waits for the bus
    # its stack is restarting rather than failing.
    struck.command("a look at the jobs while nats-server was down", _look(stack, job))
    await asyncio.sleep(kill.down_s)
    await asyncio.to_thread(stack.restart_nats)
    return f"nats-server down for {kill.down_s} s"


async def _stop(stack: EmbeddedStack, names: list[str], sig: signal.Signals) -> None:
    """Signal each process of the stack (with its group), then wait until
    each has exited: all at once, as an upgrade stops them."""
    for name in names:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stack.procs[name].pid, sig)
    for name in names:
        await asyncio.to_thread(stack.procs[name].wait, 30)


async def _operator(stack: EmbeddedStack, *args: str) -> str | None:
    """An operator's command through the real CLI, which waits until it is
    carried out; what it said, or None when the job had already ended (an
    operator's stop that races the job's end is refused, rightly)."""
    done = await asyncio.to_thread(run_cli, *args, "--json", env=stack_cli_env(stack.state_dir),
                                   timeout=200)
    if done.returncode != 0:
        if re.search(r"it is (completed|failed)", done.stderr):
            return None
        raise AssertionError(f"primus-safe {' '.join(args)} exited {done.returncode}: "
                             f"{done.stderr.strip() or done.stdout.strip()}")
    return json.loads(done.stdout)["message"]


async def _look(stack: EmbeddedStack, job: str) -> str:
    """``primus-safe jobs`` through the real CLI; what it saw of the job."""
    done = await asyncio.to_thread(run_cli, "jobs", "--json", env=stack_cli_env(stack.state_dir),
                                   timeout=90)
    if done.returncode != 0:
        raise AssertionError(f"primus-safe jobs exited {done.returncode}: "
                             f"{done.stderr.strip() or done.stdout.strip()}")
    status = {r["job"]: r["status"] for r in json.loads(done.stdout)}.get(job)
    waited = "it waited for the bus" if "waiting up to" in done.stderr else "no wait"
    return f"{waited}; job {job} {status}"


async def _check(bus: Bus, stack: EmbeddedStack, job: str, final: dict[str, Any],
                 ckpts: Checkpoints, marker: Path, struck: Struck) -> list[str]:
    """Gather what the run left and ask every invariant about it."""
    async def stream() -> list[Event]:
        last = (await bus.js.stream_info("CONTROL")).state.last_seq
        return [parse_event((await bus.js.get_msg("CONTROL", s)).data)
                for s in range(1, last + 1)]

    settled = [e.id for e in await poll(stream, "the CONTROL stream", 30)]

    async def history() -> dict[str, int] | None:
        stored = {r["id"]: r["copies"] for r in await lens(bus, "event_ids")}
        return stored if set(settled) <= set(stored) else None

    with contextlib.suppress(AssertionError):  # what is missing is reported below
        await poll(history, "every control event in the history table", 45, every=1.0)
    stored = {r["id"]: r["copies"] for r in await lens(bus, "event_ids")}
    events = await stream()
    found = history_violations([e.id for e in events], stored, settled=len(settled))
    found += placement_violations(events)
    ends = [e.type for e in events if e.type in ("job.completed", "job.failed") and e.job == job]
    if ends != [f"job.{final['status']}"]:
        found.append(f"{job} is {final['status']} in its record, but the stream says {ends}")

    markers = [(j, int(a), int(r), n, int(p)) for j, a, r, n, p in
               (line.split() for line in marker.read_text().splitlines())]
    found += process_violations(markers)

    # A node killed in the job's last seconds (or after it ended) is found
    # by its missed heartbeats a few seconds later, and, while the scheduler
    # cannot answer for its workers, up to twice its lease (30 s) after its
    # last beat: give failover that long. An agent stopped cleanly (an
    # upgrade, a rollout) announced it would be back within its grace; a node
    # killed before its agent beat again is judged when that grace is over.
    async def quarantined() -> bool:
        return not quarantine_violations(await bucket(bus, "nodes"),
                                         (await bucket(bus, "faults")).values(), struck.killed)

    grace_s = Settings.model_fields["agent_restart_grace_s"].default if struck.announced else 0
    with contextlib.suppress(AssertionError):  # what is wrong is reported below
        await poll(quarantined, "failover to quarantine the killed nodes", 45 + grace_s)
    faults = (await bucket(bus, "faults")).values()
    nodes = await bucket(bus, "nodes")
    found += quarantine_violations(nodes, faults, struck.killed)
    found += agent_violations(faults, struck.restarted, struck.killed)
    found += drain_violations(events, nodes, struck.drained)
    found += retry_violations(job, final["retries"], struck.failing_strikes)

    # Attempts that trained to the end reported steps; wait for Lens to have them.
    trained = {a for a, logs in _rank_logs(stack.state_dir, job).items()
               if any(int(m.group(1)) < ITERATIONS for t in logs.values() if (m := DONE.search(t)))}

    async def telemetry() -> list[dict[str, Any]] | None:
        rows = await lens(bus, "job_attempts", job=job)
        return rows if trained <= {r["attempt"] for r in rows} else None

    with contextlib.suppress(AssertionError):  # an attempt without steps is checked without
        await poll(telemetry, f"telemetry of attempts {sorted(trained)}", 30)
    first_steps = {r["attempt"]: r["first_iteration"]
                   for r in await lens(bus, "job_attempts", job=job)}
    found += resume_violations(_attempts(stack.state_dir, job, first_steps), ckpts.complete_at())
    return found


def _rank_logs(state: Path, job: str) -> dict[int, dict[int, str]]:
    """attempt -> rank -> what the worker printed."""
    return {int(d.name.removeprefix("attempt-")): {
                int(p.stem.removeprefix("rank-")): p.read_text(errors="replace")
                for p in d.glob("rank-*.log")}
            for d in sorted((state / "jobs" / job).glob("attempt-*"))}


def _attempts(state: Path, job: str, first_steps: dict[int, int]) -> list[AttemptStart]:
    """Each attempt whose workers began training: when it was launched (the
    driver's intent files), which step each rank loaded (its log: a resume,
    or where it says it trained from), its first step (Lens)."""
    out = []
    for attempt, logs in _rank_logs(state, job).items():
        intents = [float(p.read_text()) for p in
                   (state / "intents").glob(f"{job}-a{attempt}-r*")]
        resumed = {}
        for rank, text in logs.items():
            if m := RESUMED.search(text) or DONE.search(text):
                resumed[rank] = int(m.group(1))
            elif attempt in first_steps:  # it trained, from scratch
                resumed[rank] = 0
        if resumed and intents:  # else: killed before it loaded anything
            out.append(AttemptStart(attempt, min(intents), resumed, first_steps.get(attempt)))
    return out
