"""``primus-safe stop|resume|cancel|delete JOB``: an operator's hand on a job.

Each verb reads the job's record, asks the lifecycle whether the act applies
(an unknown job, or one in a final state, is an error that names its state;
asking twice is not), publishes the request as an event (durable in the
CONTROL stream: a scheduler that is away acts on it when it is back), and
by default waits until the scheduler has carried it out: ``stop`` until every
worker has exited, ``delete`` until the record is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import socket
from typing import Any

from cli.client import CliError, connect, state_bucket, wait_for
from cli.output import load_settings
from libs.bus import Bus
from libs.events import (
    Event,
    JobCancelRequested,
    JobCommandData,
    JobDeleteRequested,
    JobResumeRequested,
    JobStopRequested,
)
from libs.records import JOBS, JobRecord
from services.scheduler.lifecycle import Action, check

VERBS: dict[str, tuple[type[Event], str]] = {
    "stop": (JobStopRequested, "stop a job: its workers checkpoint and exit (it can be resumed)"),
    "resume": (JobResumeRequested, "queue a stopped job again, from its newest checkpoint"),
    "cancel": (JobCancelRequested, "stop a job for good"),
    "delete": (JobDeleteRequested, "forget a job (stopping it first); its history stays in Lens"),
}


def add_parsers(sub: Any) -> None:
    for verb, (_, help_text) in VERBS.items():
        s = sub.add_parser(verb, help=help_text)
        s.add_argument("job")
        s.add_argument("--reason", default="", help="why, recorded with the event")
        s.add_argument("--no-wait", dest="wait", action="store_false",
                       help="return once the request is on the bus")
        s.add_argument("--timeout", type=float, default=120.0,
                       help="seconds to wait for the scheduler to carry it out (default 120)")
        s.add_argument("--json", action="store_true")


def operator() -> str:
    """Who is asking, as the event records it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise CliError(f"--timeout {args.timeout:g}: write a positive number of seconds")
    result = asyncio.run(control(args.verb, args.job, reason=args.reason, wait=args.wait,
                                 timeout_s=args.timeout))
    print(json.dumps(result, indent=2) if args.json else result["message"])
    return 0


async def control(action: Action, job: str, *, reason: str = "", wait: bool = True,
                  timeout_s: float = 120.0) -> dict[str, Any]:
    bus = await connect(load_settings())
    try:
        return await _control(bus, action, job, reason, wait, timeout_s)
    finally:
        await bus.close()


async def _control(bus: Bus, action: Action, job: str, reason: str, wait: bool,
                   timeout_s: float) -> dict[str, Any]:
    records = await state_bucket(bus, JOBS)
    try:
        record = await records.get(job)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    verdict, line = check(record, action, job)
    if verdict == "refused":
        raise CliError(line)
    assert record is not None
    if verdict == "noop":
        return _result(action, job, record, changed=False, message=line)
    kind = VERBS[action][0]
    request = kind(source="cli", job=job,  # type: ignore[call-arg]
                   data=JobCommandData(by=operator(), reason=reason))
    await bus.publish(request)
    if not wait:
        return _result(action, job, record, changed=True,
                       message=f"job {job}: {action} requested (not waiting)")
    last: list[JobRecord | None] = [record]

    async def done() -> dict[str, Any] | None:
        now = last[0] = await records.get(job)
        if now is not None and now.last_command != request.id:
            # Not taken yet. If the job moved to where the request no longer
            # applies (it completed, someone else cancelled it), the
            # scheduler will say so too and act on nothing: do not wait.
            verdict, line = check(now, action, job)
            if verdict == "refused":
                raise CliError(f"{line} (it changed after the {action} was sent)")
            if verdict == "noop":
                return _result(action, job, now, changed=False, message=line)
        if not _done(action, now, request.id):
            return None
        return _result(action, job, now, changed=True, message=_said(action, job, now))

    def late() -> str:
        now = last[0]
        state = now.status if now is not None else "gone"
        taken = now is not None and now.last_command == request.id
        return (f"job {job}: {action} requested {timeout_s:g} s ago and the job is still "
                f"{state}" + ("" if taken else " (no scheduler has taken the request yet: "
                              "is one running? it acts on the request when it is)")
                + "; primus-safe explain " + job + " shows where it stands")

    return await wait_for(done, timeout_s, late)


def _done(action: Action, now: JobRecord | None, request: str) -> bool:
    if action == "delete":
        return now is None
    if now is None:
        return True  # deleted meanwhile: nothing left to wait for
    if now.last_command != request:
        return False  # the scheduler has not taken it yet
    return now.status != "stopping"


def _said(action: Action, job: str, now: JobRecord | None) -> str:
    if now is None:
        return f"job {job} deleted"
    if action == "resume":
        return f"job {job} resumed: {now.status}"
    return f"job {job} {now.status}" + (f": {now.reason}" if now.reason else "")


def _result(action: Action, job: str, record: JobRecord | None, *, changed: bool,
            message: str) -> dict[str, Any]:
    return {"job": job, "action": action, "changed": changed,
            "status": record.status if record is not None else "deleted",
            "attempt": record.attempt if record is not None else None, "message": message}
