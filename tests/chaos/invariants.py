"""What must hold after a chaos run, as pure functions over plain data.

Each check takes what the run left behind (the CONTROL stream's events, the
ids in Lens's history table, the ``nodes`` and ``faults`` buckets, the
worker start markers, checkpoint and launch times, resume points) and
returns the violations it found, as sentences naming the job, attempt,
rank, node or event. An empty list means the invariant held. No I/O here:
``test_chaos_invariants`` feeds each check broken data to prove it can fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from libs.events import Event, JobPlaced, NodeDrainRequested, WorkerExited, WorkerStarted

# Node states that take a node out of service after a fault (quarantined).
QUARANTINED = ("quarantined", "repair")


def history_violations(published: list[str], stored: Mapping[str, int],
                       settled: int | None = None) -> list[str]:
    """Every control event in the stream is there once and in the history
    table exactly once, and nothing is in the table that the stream does not
    hold. The stream keeps growing (the stack runs on): only its first ``settled``
    events must be stored already."""
    out = [f"event {i} is in the CONTROL stream {n} times"
           for i, n in Counter(published).items() if n > 1]
    missing = sorted(set(published[:settled]) - set(stored))
    if missing:
        out.append(f"{len(missing)} event(s) lost from the history table, e.g. {missing[:5]}")
    out += [f"event {i} stored {n} times in the history table"
            for i, n in sorted(stored.items()) if n != 1]
    extra = sorted(set(stored) - set(published))
    if extra:
        out.append(f"{len(extra)} stored event(s) the stream never held, e.g. {extra[:5]}")
    return out


def placement_violations(events: Iterable[Event]) -> list[str]:
    """Nothing placed twice: one placement per attempt (a re-announcement
    after a restart is identical), every worker on the node its placement
    named, no rank of an attempt started twice, and no worker of a new
    attempt started while a worker of an older attempt of the job still runs."""
    out: list[str] = []
    placed: dict[tuple[str, int], dict[int, str]] = {}
    live: dict[tuple[str, int, int], str] = {}
    started: set[tuple[str, int, int]] = set()
    for e in events:
        if isinstance(e, JobPlaced):
            slots = {w.rank: w.node for w in e.data.workers}
            first = placed.setdefault((e.job, e.data.attempt), slots)
            if first != slots:
                out.append(f"{e.job} attempt {e.data.attempt} placed twice: {first} then {slots}")
        elif isinstance(e, WorkerStarted):
            key = (e.job, e.data.attempt, e.data.rank)
            slots = placed.get(key[:2])
            if slots is None:
                out.append(f"{e.job} attempt {key[1]} rank {key[2]} started without a placement")
            elif slots.get(key[2]) != e.node:
                out.append(f"{e.job} attempt {key[1]} rank {key[2]} started on {e.node}, "
                           f"placed on {slots.get(key[2])}")
            if key in started:
                out.append(f"{e.job} attempt {key[1]} rank {key[2]} started twice")
            others = sorted({(a, r, n) for (j, a, r), n in live.items()
                             if j == e.job and a != key[1]})
            if others:
                out.append(f"{e.job} attempt {key[1]} rank {key[2]} started on {e.node} while "
                           f"(attempt, rank, node) {others} still ran")
            started.add(key)
            live[key] = e.node
        elif isinstance(e, WorkerExited):
            live.pop((e.job, e.data.attempt, e.data.rank), None)
    out += [f"{j} attempt {a} rank {r} on {n} never reported its exit"
            for (j, a, r), n in sorted(live.items())]
    return out


def process_violations(markers: Iterable[tuple[str, int, int, str, int]]) -> list[str]:
    """From the workers' own start markers (job, attempt, rank, node, pid):
    no rank of an attempt ran as two processes."""
    runs: dict[tuple[str, int, int], list[tuple[str, int]]] = {}
    for job, attempt, rank, node, pid in markers:
        runs.setdefault((job, attempt, rank), []).append((node, pid))
    return [f"{j} attempt {a} rank {r} ran {len(p)} times as (node, pid) {p}"
            for (j, a, r), p in sorted(runs.items()) if len(p) > 1]


def quarantine_violations(nodes: Mapping[str, Mapping[str, Any]],
                      faults: Iterable[Mapping[str, Any]],
                      killed: Iterable[str] = ()) -> list[str]:
    """No node is out of service without an open fault for it (a closed one
    means it passed bench and must be back); every node the run killed is
    out of service with an open fault."""
    open_for = {f["key"] for f in faults if f["scope"] == "node" and f["status"] != "closed"}
    out = [f"{name} is {n['state']} without an open fault"
           for name, n in sorted(nodes.items()) if n["state"] in QUARANTINED
           and name not in open_for]
    for name in sorted(set(killed)):
        state = nodes.get(name, {}).get("state")
        if state not in QUARANTINED or name not in open_for:
            out.append(f"{name} was killed but is {state} with "
                       f"{'an' if name in open_for else 'no'} open fault")
    return out


def agent_violations(faults: Iterable[Mapping[str, Any]], restarted: Iterable[str],
                     killed: Iterable[str] = ()) -> list[str]:
    """A node whose agent alone was restarted (its workers kept running) is
    never evacuated: no heartbeat fault that moved jobs. A node also killed
    outright is the node kill's to judge."""
    gone = set(killed)
    return [f"{f['key']}'s agent was restarted while its workers ran, yet failover "
            f"evacuated it ({f['kind']}, jobs {f['jobs']})"
            for f in faults if f["scope"] == "node" and f["kind"] == "heartbeat_missed"
            and f["jobs"] and f["key"] in set(restarted) - gone]


def drain_violations(events: Iterable[Event], nodes: Mapping[str, Mapping[str, Any]],
                     drained: Iterable[str]) -> list[str]:
    """A node an operator drained gets no new worker: no placement after
    its drain request names it, and it is still cordoned at the end (nobody
    lifted the hold)."""
    out: list[str] = []
    since: set[str] = set()
    for e in events:
        if isinstance(e, NodeDrainRequested):
            since.add(e.node)
        elif isinstance(e, JobPlaced):
            out += [f"{e.job} attempt {e.data.attempt} rank {w.rank} placed on {w.node} "
                    "after it was drained" for w in e.data.workers if w.node in since]
    for name in sorted(set(drained)):
        if name not in since:
            out.append(f"{name} was drained, but no drain request is in the stream")
        elif not nodes.get(name, {}).get("cordoned"):
            out.append(f"{name} was drained, but is not cordoned at the end")
    return out


def retry_violations(job: str, retries: int, failing_strikes: int) -> list[str]:
    """Only a strike that kills a worker (a node's death, a worker's) may
    spend one of the job's retries: not a restart of a service or an agent,
    not an outage of the bus, not an operator's stop or drain."""
    if retries <= failing_strikes:
        return []
    return [f"{job} spent {retries} retries, but only {failing_strikes} strike(s) killed "
            "its workers"]


@dataclass(frozen=True)
class AttemptStart:
    """One attempt of a job as its workers began it."""

    attempt: int
    launched_at: float  # when the driver decided to start its first rank
    resumed_from: dict[int, int]  # rank -> checkpoint step it loaded (0: none)
    first_step: int | None  # first training step it reported (None: no telemetry)


def resume_violations(attempts: Iterable[AttemptStart],
                      complete_at: Mapping[int, float], *, slack_s: float = 1.0) -> list[str]:
    """Each attempt resumed from the newest checkpoint that was complete when
    it was launched (``complete_at``: step -> when every rank's file was
    there, never earlier than the truth), every rank from the same one, and
    its first step is the next. A step seen complete only just after the
    launch (``slack_s``) may still have been the newest one."""
    out = []
    for a in attempts:
        froms = set(a.resumed_from.values())
        if len(froms) != 1:
            out.append(f"attempt {a.attempt}: ranks resumed from different steps "
                       f"{a.resumed_from}")
            continue
        resumed = froms.pop()
        newest = max((s for s, t in complete_at.items() if t < a.launched_at), default=0)
        if resumed < newest:
            out.append(f"attempt {a.attempt} resumed from step {resumed}, but step {newest} was "
                       "complete before its launch")
        elif resumed and complete_at.get(resumed, float("inf")) > a.launched_at + slack_s:
            out.append(f"attempt {a.attempt} resumed from step {resumed}, which was not "
                       "complete at its launch")
        if a.first_step is not None and a.first_step != resumed + 1:
            out.append(f"attempt {a.attempt}: first step {a.first_step} after resuming from "
                       f"{resumed} (expected {resumed + 1})")
    return out
