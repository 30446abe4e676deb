"""``primus-safe explain JOB``: where a job runs or why it waits (its queue
position and the scheduler's reason), its history from Lens, and where its
workers' logs are when the local driver wrote them under the state dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli.client import CliError, connect, lens_query, read_bucket
from libs.records import FAULTS, JOBS, NODES, JobRecord
from libs.settings import Settings


async def explain(job: str, settings: Settings) -> dict[str, Any]:
    """The ``--json`` document: the job's record, its history from Lens (or
    why there is none) and its workers' log files."""
    bus = await connect(settings)
    try:
        record = (await read_bucket(bus, JOBS)).get(job)
        if record is None:
            raise CliError(f"no job {job!r}; `primus-safe jobs` lists them")
        nodes = await read_bucket(bus, NODES, missing_ok=True)
        degraded = sorted({n for n in record.nodes if n in nodes and nodes[n].degraded})
        faults = sorted((f for f in (await read_bucket(bus, FAULTS, missing_ok=True)).values()
                         if job in f.jobs), key=lambda f: f.opened_at)
        note = None
        try:
            history = await lens_query(bus, "events", job=job, node="", limit=500)
        except CliError as exc:
            history, note = [], str(exc)
    finally:
        await bus.close()
    doc: dict[str, Any] = {"job": record.model_dump(mode="json"), "history": history,
                           "logs": worker_logs(Path(settings.state_dir), job, record.attempt),
                           "degraded_nodes": degraded,
                           "faults": [{"fault_id": f.fault_id, "kind": f.kind, "key": f.key,
                                       "status": f.status, "reason": f.reason,
                                       "resume_step": f.resume_step.get(job),
                                       "lost_work_s": f.lost_work_s.get(job), **f.timings()}
                                      for f in faults]}
    if note is not None:
        doc["history_note"] = note
    return doc


def worker_logs(state_dir: Path, job: str, attempt: int) -> list[str]:
    """The local driver's rank logs of the job's latest attempt (none on k8s:
    there ``kubectl logs`` has them)."""
    run_dir = state_dir.resolve() / "jobs" / job / f"attempt-{attempt}"
    return [str(p) for p in sorted(run_dir.glob("rank-*.log"))] if run_dir.is_dir() else []


def describe(doc: dict[str, Any]) -> str:
    """The document ``explain`` made, as lines for a person."""
    r = JobRecord.model_validate(doc["job"])
    spec = r.spec
    lines = [f"job {r.id} ({spec.name}): {r.status}; workspace {spec.workspace}, "
             f"priority {spec.priority}, {spec.workers} worker(s) x "
             f"{spec.gpus_per_worker} GPU(s); attempt {r.attempt}, "
             f"{r.retries} of {spec.max_retry} retries used"]
    lines += [f"note: {note}" for note in r.notes]
    if r.holds_gpus:
        where = ", ".join(f"rank {s.rank} on {s.node}" for s in r.slots)
        lines.append(f"runs on: {where}")
        if doc.get("degraded_nodes"):
            lines.append(f"on degraded node(s): {', '.join(doc['degraded_nodes'])} (their bench "
                         "passed below their fleet; used because healthy nodes could not hold "
                         "the gang)")
        if r.status == "stopping":
            then = {"requeue": "queued again", "preempted": "queued again at the head",
                    "fail": "failed", "stop": "stopped (resumable)", "cancel": "cancelled",
                    "delete": "forgotten"}.get(r.after_stop or "", "")
            lines.append(f"stopping: {r.reason}" + (f"; then {then}" if then else ""))
    elif r.status == "pending" and r.code == "unschedulable":
        lines.append(f"unschedulable: {r.reason}; it waits for the cluster to grow (checked "
                     f"again as nodes register) and does not hold up the jobs behind it")
    elif r.status == "pending":
        lines.append(f"waits: position {r.position} in workspace {spec.workspace}: "
                     f"{r.reason or 'not considered yet'}" + (f" [{r.code}]" if r.code else ""))
        if r.recovering:
            lines.append(f"recovering: served first, avoiding {', '.join(r.exclude_nodes)}")
    elif r.status == "stopped":
        lines.append(f"stopped: {r.reason}; primus-safe resume {r.id} queues it again from its "
                     "newest checkpoint")
    elif r.reason:
        lines.append(f"ended: {r.reason}")
    if r.spec.max_runtime_s is not None:
        lines.append(f"max runtime: {r.spec.max_runtime_s:g} s ({r.run_s:.0f} s used by ended "
                     "attempts)")
    for f in doc.get("faults", []):
        cost = (f"; resumed from step {f['resume_step']}, {f['lost_work_s']:.0f} s of training "
                "redone" if f.get("resume_step") is not None else
                "; no checkpoint known: it starts over")
        recovered = (f", training again {f['first_step_s']} s after the last healthy sign"
                     if f.get("first_step_s") is not None else "")
        lines.append(f"fault {f['fault_id']} ({f['kind']} on {f['key']}, {f['status']}): "
                     f"{f['reason']}{cost}{recovered}")
    if doc.get("logs"):
        lines.append("worker logs: " + ", ".join(doc["logs"]) + f" (and `primus-safe logs "
                     f"{r.id}`)")
    if doc["history"]:
        lines.append("history:")
        for e in doc["history"]:
            data = json.loads(e["data"]) if isinstance(e["data"], str) else e["data"]
            lines.append(f"  {e['time']}  {e['type']:<15} {summary(e['type'], data)}")
    elif doc.get("history_note"):
        lines.append(f"history unavailable: {doc['history_note']}")
    return "\n".join(lines)


def summary(kind: str, data: dict[str, Any]) -> str:
    """One event's data as a short line (``explain`` and ``lens job``)."""
    if kind == "job.placed":
        return "attempt {} on {}".format(data["attempt"],
                                         ", ".join(w["node"] for w in data["workers"]))
    if kind == "job.pending":
        return f"#{data['position']}: {data['reason']}"
    if kind in ("worker.started", "worker.exited"):
        code = f" exit {data['exit_code']}" if "exit_code" in data else ""
        lost = " (lost)" if data.get("lost") else ""
        why = f": {data['reason']}" if data.get("reason") else ""
        return f"attempt {data['attempt']} rank {data['rank']}{code}{lost}{why}"
    if kind == "job.preempted":
        return f"by {data['preemptor']} (grace {data['grace_s']} s)"
    if not isinstance(data, dict):
        return ""
    # operators' requests (job.stop, ...) and their outcomes (job.stopped, ...)
    who = f"by {data['by']}" if data.get("by") else ""
    return ": ".join(p for p in (who, data.get("reason", "")) if p)
