"""The job lifecycle (pure: no I/O, the clock is passed in).

A job record moves through these states::

    pending ──placed──▶ running ──every rank exits 0──▶ completed
       ▲                   │
       │                   ├─ rank fails / node lost / failover ─┐
       │                   ├─ preempted ─────────────────────────┤
       │                   ├─ operator stop / cancel / delete ───┤
       │                   └─ ran past max_runtime_s ────────────┤
       │                                                         ▼
       └──── requeue (retry with back-off) / preempted ◀──── stopping ──▶ stopped | failed
                                                                        | cancelled | (deleted)

``stopping`` holds the gang's GPUs until every rank has reported its exit
(or the stop times out); ``then`` says what the job becomes afterwards.
``completed``, ``failed`` and ``cancelled`` are final: nothing moves a job
out of them but ``delete`` (or ``ttl_after_finished_s``), which forgets it.
``stopped`` keeps the job and its checkpoints; ``resume`` queues it again.

Each input is a fact (``Placed``, ``Exited``, ``Command``, ...) applied by
``apply``, which returns the new record and the effects, in order, that the
shell carries out: save the record, announce an event, launch or stop the
gang's workers, forget the job. ``due`` turns the clock into facts (a stop
that timed out, a deadline, an expired TTL). The retry rule — a failed
attempt spends one retry, and past ``max_retry`` the job fails — lives in
``_attempt_failed`` and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from libs.events import WorkerSlot
from libs.records import AfterStop, JobRecord, JobStatus

FINAL: frozenset[JobStatus] = frozenset({"completed", "failed", "cancelled"})
Action = Literal["stop", "resume", "cancel", "delete"]
Announcement = Literal["placed", "preempted", "completed", "failed", "stopped", "cancelled",
                       "deleted"]


@dataclass(frozen=True)
class Limits:
    """The lifecycle's knobs (the scheduler's configuration)."""

    preemption_grace_s: float = 30.0  # a victim's time to checkpoint
    stop_grace_s: float = 30.0  # an operator's stop: checkpoint, then SIGKILL
    recover_grace_s: float = 10.0  # failover restarts a gang that still runs
    broken_gang_grace_s: float = 3.0  # survivors of a lost rank wait on a dead peer
    stop_timeout_extra_s: float = 60.0  # past the grace, a stop is taken as done
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    launch_retry_s: float = 30.0  # a launch refused for a missing Secret/claim waits this long

    def backoff_s(self, retries: int) -> float:
        """Wait before retry ``retries``: 5 s, 10 s, 20 s … capped at 5 min.
        Long enough that failover has quarantined a dead node before it."""
        return min(self.backoff_cap_s, self.backoff_base_s * 2 ** max(0, retries - 1))


# ------------------------------------------------------------------ facts


@dataclass(frozen=True)
class Placed:
    slots: tuple[WorkerSlot, ...]


@dataclass(frozen=True)
class LaunchFailed:
    error: str


@dataclass(frozen=True)
class LaunchBlocked:
    """The cluster refused the launch before creating anything (a Secret or
    claim the job names is missing): not the job's failure."""

    reason: str


@dataclass(frozen=True)
class Exited:
    attempt: int
    rank: int
    code: int
    node: str
    reason: str = ""
    lost: bool = False  # killed while no driver watched: no retry spent
    node_down: bool = False  # never started, its node was down: no retry spent


@dataclass(frozen=True)
class NodeLost:
    node: str
    reason: str


@dataclass(frozen=True)
class Drain:
    """An operator drains a node: its gangs checkpoint and move away, queued
    again at the head of their class, no retry spent."""

    node: str
    reason: str


@dataclass(frozen=True)
class Recover:
    reason: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preempt:
    preemptor: str


@dataclass(frozen=True)
class Refuse:
    reason: str


@dataclass(frozen=True)
class Command:
    action: Action
    by: str = ""
    reason: str = ""
    id: str = ""  # the request's event id: a redelivered request is done once


@dataclass(frozen=True)
class StopTimedOut:
    pass


@dataclass(frozen=True)
class Deadline:
    max_runtime_s: float


@dataclass(frozen=True)
class Expired:
    ttl_s: float


Fact = (Placed | LaunchFailed | LaunchBlocked | Exited | NodeLost | Drain | Recover | Preempt
        | Refuse | Command | StopTimedOut | Deadline | Expired)

# ------------------------------------------------------------------ effects


@dataclass(frozen=True)
class Save:
    """Write the record (before anything below it is announced or done)."""


@dataclass(frozen=True)
class Announce:
    what: Announcement
    detail: str = ""  # the preemptor of a preemption


@dataclass(frozen=True)
class Launch:
    """Start the gang's ranks that are not started (idempotent per attempt)."""


@dataclass(frozen=True)
class StopWorkers:
    grace_s: float
    wait: bool = False  # finish the stop before the next effect


@dataclass(frozen=True)
class Forget:
    """Remove the record: the scheduler no longer knows the job."""


@dataclass(frozen=True)
class Reannounce:
    """An exit of an ended job came again: make sure its end was published."""


Effect = Save | Announce | Launch | StopWorkers | Forget | Reannounce


@dataclass(frozen=True)
class Step:
    """What a fact did: the record now (None once forgotten), the effects in
    order, and a line for whoever asked (a command's answer)."""

    record: JobRecord | None
    effects: tuple[Effect, ...] = ()
    answer: str = ""
    refused: bool = False


@dataclass
class _Draft:
    job: JobRecord
    effects: list[Effect] = field(default_factory=list)

    def done(self, answer: str = "") -> Step:
        gone = any(isinstance(e, Forget) for e in self.effects)
        return Step(None if gone else self.job, tuple(self.effects), answer)


# ------------------------------------------------------------------ questions


def runtime_s(job: JobRecord, now: float) -> float:
    """Seconds the job has run, over all its attempts (stopped time is not counted)."""
    current = now - job.started_at if job.started_at is not None and job.holds_gpus else 0.0
    return job.run_s + max(0.0, current)


def check(job: JobRecord | None, action: Action, job_id: str = "") -> tuple[str, str]:
    """Whether an operator's ``action`` applies to ``job``: ("ok" | "noop" |
    "refused", a line saying so). The CLI asks before it publishes; the
    scheduler asks again when the command arrives (the job may have moved)."""
    name = job.id if job is not None else job_id
    if job is None:
        return "refused", f"job {name} not found"
    status, then = job.status, job.after_stop
    if action == "delete":
        if status == "stopping" and then == "delete":
            return "noop", f"job {name} is already being deleted"
        return "ok", ""
    if status in FINAL:
        if action == "cancel" and status == "cancelled":
            return "noop", f"job {name} is already cancelled"
        return "refused", (f"cannot {action} job {name}: it is {status}, a final state "
                           f"(primus-safe delete {name} forgets it)")
    if action == "stop":
        if status == "stopped" or (status == "stopping" and then == "stop"):
            return "noop", f"job {name} is already {status}"
        if status == "stopping" and then in ("cancel", "delete"):
            return "refused", f"cannot stop job {name}: it is being {_ING[then]}"
        return "ok", ""
    if action == "cancel":
        if status == "stopping" and then in ("cancel", "delete"):
            return "noop", f"job {name} is already being {_ING[then]}"
        return "ok", ""
    # resume
    if status in ("pending", "running") or (status == "stopping" and then != "stop"):
        if status == "stopping" and then in ("cancel", "delete"):
            return "refused", f"cannot resume job {name}: it is being {_ING[then]}"
        return "noop", f"job {name} is {status}, not stopped: nothing to resume"
    return "ok", ""


_ING = {"cancel": "cancelled", "delete": "deleted"}


def due(job: JobRecord, now: float, limits: Limits) -> Fact | None:
    """What the clock alone has made happen to ``job``, if anything."""
    if job.status == "stopping" and job.stop_requested_at is not None \
            and now - job.stop_requested_at > job.grace_s + limits.stop_timeout_extra_s:
        return StopTimedOut()
    limit = job.spec.max_runtime_s
    if job.status == "running" and limit is not None and runtime_s(job, now) > limit:
        return Deadline(limit)
    ttl = job.spec.ttl_after_finished_s
    if job.status in FINAL and ttl is not None and job.finished_at is not None \
            and now - job.finished_at >= ttl:
        return Expired(ttl)
    return None


def on_restart(job: JobRecord, limits: Limits) -> tuple[Effect, ...]:
    """A new scheduler leader found this record: finish what the last one
    may have left half done. A placement is announced and launched again
    (both idempotent: same event id, only ranks that never started start);
    a stop is sent again (a rank stuck on a dead peer would run on, and the
    stop timeout would place the next attempt beside it)."""
    if job.status == "running":
        return (Announce("placed"), Launch())
    if job.status == "stopping":
        return (StopWorkers(job.grace_s),)
    return ()


# ------------------------------------------------------------------ transitions


def apply(job: JobRecord, fact: Fact, now: float, limits: Limits) -> Step:
    """The job after ``fact``; ``job`` itself is not changed."""
    draft = _Draft(job.model_copy(deep=True))
    match fact:
        case Placed():
            return _placed(draft, fact, now)
        case LaunchFailed():
            return _launch_failed(draft, fact, now, limits)
        case LaunchBlocked():
            if draft.job.status != "running":
                return Step(job)
            # Nothing was created: back to the queue with no retry spent,
            # tried again after a pause (what is missing may be created).
            draft.job.blocked = fact.reason
            draft.job.not_before = now + limits.launch_retry_s
            _stop(draft, "requeue", f"cannot launch: {fact.reason}", now, grace_s=0.0,
                  at_once=True)
            return draft.done()
        case Exited():
            return _exited(draft, fact, now, limits)
        case NodeLost():
            return _node_lost(draft, fact, now, limits)
        case Drain():
            if draft.job.status != "running" or fact.node not in draft.job.nodes:
                return Step(job)
            # The node is cordoned (nothing is placed there): no exclusion to
            # outlive the drain, only a preference for the gang's other nodes.
            draft.job.prefer_nodes = sorted(set(draft.job.nodes) - {fact.node})
            _stop(draft, "preempted", f"node {fact.node} {fact.reason}", now,
                  grace_s=limits.stop_grace_s)
            return draft.done()
        case Recover():
            return _recover(draft, fact, now, limits)
        case Preempt():
            return _preempt(draft, fact, now, limits)
        case Refuse():
            return _refuse(draft, fact, now)
        case Command():
            return _command(draft, fact, now, limits)
        case StopTimedOut():
            if draft.job.status != "stopping":
                return Step(job)
            draft.effects.append(StopWorkers(0.0, wait=True))  # what is left must be gone
            _finish_stop(draft, now)
            return draft.done()
        case Deadline():
            if draft.job.status != "running":
                return Step(job)
            draft.job.code = "deadline"
            _stop(draft, "fail", f"ran past max_runtime_s ({fact.max_runtime_s:g} s)", now,
                  grace_s=limits.stop_grace_s)
            return draft.done()
        case Expired():
            if draft.job.status not in FINAL:
                return Step(job)
            draft.job.reason = f"ttl_after_finished_s ({fact.ttl_s:g} s) passed"
            draft.effects += [Forget(), Announce("deleted")]
            return draft.done()
    raise TypeError(f"not a lifecycle fact: {fact!r}")  # pragma: no cover


def _placed(draft: _Draft, fact: Placed, now: float) -> Step:
    job = draft.job
    if job.status != "pending":
        return Step(job)
    job.attempt += 1
    job.status, job.started_at, job.exits = "running", now, {}
    job.slots = list(fact.slots)
    job.recovering = job.preempted = False
    job.exclude_nodes, job.prefer_nodes = [], []
    job.reason = job.code = job.blocked = ""
    draft.effects += [Save(), Announce("placed"), Launch()]
    return draft.done()


def _launch_failed(draft: _Draft, fact: LaunchFailed, now: float, limits: Limits) -> Step:
    job = draft.job
    if job.status != "running":
        return Step(job)
    # Nothing of this attempt may survive it: the stop ends at once.
    _attempt_failed(draft, f"launch failed: {fact.error}", now, limits, backoff=True,
                    grace_s=0.0, at_once=True)
    return draft.done()


def _exited(draft: _Draft, fact: Exited, now: float, limits: Limits) -> Step:
    job = draft.job
    if fact.attempt != job.attempt:
        return Step(job)  # an old attempt's
    if job.status in ("completed", "failed"):
        return Step(job, (Reannounce(),))
    if not job.holds_gpus:
        return Step(job)  # already handled
    if job.exits.get(fact.rank) == fact.code:
        return Step(job)  # a redelivery
    if fact.lost and fact.rank in job.exits:
        return Step(job)  # its end is known: gone afterwards is no loss
    job.exits[fact.rank] = fact.code
    if job.status == "stopping":
        if len(job.exits) >= len(job.slots):
            _finish_stop(draft, now)
        else:
            draft.effects.append(Save())
        return draft.done()
    if fact.lost or fact.node_down:
        # Like a Kubernetes disruption, not the job's failure: its next
        # attempt runs at once, first in the queue, and spends no retry. A
        # rank refused because its node was down (placed there before
        # failover judged it: a resume, a queued job) is the same loss; the
        # scheduler holds that node out of placement (node_holds), so the
        # next attempt does not land on it again.
        job.not_before, job.recovering = 0.0, True
        why = (f"rank {fact.rank} could not start: {fact.node} is down (failover has not "
               "judged it yet)" if fact.node_down else
               f"rank {fact.rank} on {fact.node} was lost ({fact.reason or 'no exit recorded'})")
        _stop(draft, "requeue", f"{why}; running the gang again, no retry spent", now,
              grace_s=limits.broken_gang_grace_s)
        return draft.done()
    if fact.code != 0:
        why = f" ({fact.reason})" if fact.reason else ""
        _attempt_failed(draft, f"rank {fact.rank} on {fact.node} exited with code "
                               f"{fact.code}{why}", now, limits, backoff=True,
                        grace_s=limits.broken_gang_grace_s)
    elif len(job.exits) == len(job.slots):
        job.run_s = runtime_s(job, now)
        job.status, job.reason, job.finished_at = "completed", "", now
        draft.effects += [Save(), Announce("completed"), StopWorkers(0.0)]  # tidy pods
    else:
        draft.effects.append(Save())
    return draft.done()


def _node_lost(draft: _Draft, fact: NodeLost, now: float, limits: Limits) -> Step:
    """A node left service: a gang on it stops and is re-placed first in the
    queue, away from the node, preferring its healthy nodes."""
    job = draft.job
    was = job.last_nodes + job.nodes
    if fact.node not in was:
        return Step(job)
    if job.status == "running":
        if fact.node not in job.nodes:
            return Step(job)
        _avoid(job, fact.node, was)
        _attempt_failed(draft, f"node {fact.node} left service: {fact.reason}", now, limits,
                        backoff=False, grace_s=limits.broken_gang_grace_s)
        return draft.done()
    if job.status == "stopping" and fact.node in job.nodes:
        draft.effects.append(StopWorkers(0.0))  # no use waiting for the broken gang
    if (job.status == "pending" or job.after_stop in ("requeue", "preempted")) \
            and fact.node not in job.exclude_nodes:
        # Its attempt already failed (a rank saw the peer die before
        # failover did): the cause is known now, so no back-off and first
        # in the queue, away from the node.
        _avoid(job, fact.node, was)
        job.not_before = 0.0
        draft.effects.insert(0, Save())
    return draft.done()


def _avoid(job: JobRecord, node: str, was: list[str]) -> None:
    job.recovering = True
    job.exclude_nodes = sorted({*job.exclude_nodes, node})
    job.prefer_nodes = sorted(set(was) - set(job.exclude_nodes))


def _recover(draft: _Draft, fact: Recover, now: float, limits: Limits) -> Step:
    """Failover: restart the gang from its checkpoint, away from bad nodes."""
    job = draft.job
    if job.status != "running":
        return Step(job)
    job.recovering = True
    job.exclude_nodes = sorted({*job.exclude_nodes, *fact.exclude})
    job.prefer_nodes = sorted(set(job.nodes) - set(job.exclude_nodes))
    _attempt_failed(draft, f"failover: {fact.reason}", now, limits, backoff=False,
                    grace_s=limits.recover_grace_s)
    return draft.done()


def _preempt(draft: _Draft, fact: Preempt, now: float, limits: Limits) -> Step:
    if draft.job.status != "running":
        return Step(draft.job)
    draft.effects.append(Announce("preempted", fact.preemptor))
    _stop(draft, "preempted", f"preempted by {fact.preemptor}", now,
          grace_s=limits.preemption_grace_s)
    # Announced first: the victim's workers learn why before SIGTERM.
    return draft.done()


def _refuse(draft: _Draft, fact: Refuse, now: float) -> Step:
    """A job that can never run ends now, failed, with the reason."""
    job = draft.job
    if job.status != "pending":
        return Step(job)
    job.status, job.code, job.reason = "failed", "refused", f"refused: {fact.reason}"
    job.finished_at = now
    draft.effects += [Save(), Announce("failed")]
    return draft.done()


def _command(draft: _Draft, fact: Command, now: float, limits: Limits) -> Step:
    job = draft.job
    if fact.id and fact.id == job.last_command:
        return Step(job, (), f"job {job.id}: this {fact.action} request was done already")
    verdict, line = check(job, fact.action)
    if verdict != "ok":
        return Step(job, (), line, refused=verdict == "refused")
    job.last_command = fact.id
    who = f" by {fact.by}" if fact.by else ""
    why = f": {fact.reason}" if fact.reason else ""
    if fact.action == "resume":
        if job.status == "stopping":  # not stopped yet: queue it once it is
            job.after_stop = "requeue"
        else:
            job.status = "pending"
        job.not_before, job.reason, job.code = 0.0, f"resumed{who}{why}", ""
        job.stopped_by = ""
        draft.effects.append(Save())
        return draft.done(f"job {job.id} resumed: queued again from its newest checkpoint")
    then: AfterStop = fact.action
    job.stopped_by = fact.by
    reason = f"{_PAST[fact.action]}{who}{why}"
    if job.holds_gpus:
        if job.status == "running":
            _stop(draft, then, reason, now, grace_s=limits.stop_grace_s)
        else:  # stopping already: what it becomes changes, the stop goes on
            job.after_stop, job.reason = then, reason
            draft.effects.append(Save())
        return draft.done(f"job {job.id} is stopping (workers checkpoint, then exit within "
                          f"{job.grace_s:g} s); then {_PAST[fact.action]}")
    # pending, stopped or final: no workers to wait for
    job.reason = reason
    job.after_stop = then
    _finish_stop(draft, now)
    return draft.done(f"job {job.id} {_PAST[fact.action]}")


_PAST = {"stop": "stopped", "cancel": "cancelled", "delete": "deleted", "resume": "resumed"}


def _attempt_failed(draft: _Draft, reason: str, now: float, limits: Limits, *,
                    backoff: bool, grace_s: float, at_once: bool = False) -> None:
    """The retry rule: a failed attempt spends a retry; past ``max_retry``
    the job fails once its gang has stopped, else it is queued again (after
    a back-off unless the cause is known and avoided)."""
    job = draft.job
    job.retries += 1
    if job.retries > job.spec.max_retry:
        _stop(draft, "fail", f"gave up after {job.retries} failed attempt(s): {reason}", now,
              grace_s=grace_s, at_once=at_once)
    else:
        job.not_before = now + limits.backoff_s(job.retries) if backoff else 0.0
        _stop(draft, "requeue", reason, now, grace_s=grace_s, at_once=at_once)


def _stop(draft: _Draft, then: AfterStop, reason: str, now: float, *, grace_s: float,
          at_once: bool = False) -> None:
    """Tell every worker to stop; the job ends its attempt once every rank
    has reported its exit (its GPUs stay held until then). ``at_once``: kill
    what runs and end the attempt now."""
    job = draft.job
    job.status, job.after_stop, job.reason = "stopping", then, reason
    job.stop_requested_at, job.grace_s = now, grace_s
    if at_once:
        draft.effects.append(StopWorkers(0.0, wait=True))
    if at_once or len(job.exits) >= len(job.slots):
        _finish_stop(draft, now)
        return
    draft.effects += [Save(), StopWorkers(grace_s)]


def _finish_stop(draft: _Draft, now: float) -> None:
    """Every rank has exited (or the stop timed out): what the job becomes."""
    job = draft.job
    then = job.after_stop
    job.run_s = runtime_s(job, now)
    if job.slots:
        job.last_nodes = job.nodes
    job.slots, job.exits, job.started_at = [], {}, None
    job.after_stop, job.stop_requested_at = None, None
    if then == "fail":
        job.status, job.finished_at = "failed", now
        draft.effects += [Save(), Announce("failed")]
    elif then == "stop":
        job.status = "stopped"
        job.stops += 1
        draft.effects += [Save(), Announce("stopped")]
    elif then == "cancel":
        job.status, job.finished_at = "cancelled", now
        draft.effects += [Save(), Announce("cancelled")]
    elif then == "delete":
        draft.effects += [Forget(), Announce("deleted")]
    else:  # requeue, preempted
        job.status = "pending"
        job.preempted = then == "preempted"
        draft.effects.append(Save())
