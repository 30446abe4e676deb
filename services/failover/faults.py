"""Fault rules and fault records (pure: no I/O, the clock is passed in).

Observations come from every fault source — missed heartbeats, failing
health probes, bench verdicts, Lens alerts, worker exit codes, Kubernetes
node conditions — as (kind, key, bad?) facts; every default rule has a
producer (README, "Fault kinds"). Rules from configuration say, per kind,
how many bad observations in a row open a fault, whether it is
about a node (quarantine it, move its jobs) or a job (restart it from its
checkpoint), and whether failover acts at all. ``FaultBook`` turns facts
into decisions and keeps each fault's life: opened -> mitigated (the node is
out of service, or the job was told to restart) -> closed (the node passed
bench again, or the job runs again), with the times that make up a
recovery: detection, mitigation, re-placement and first training step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from libs.events import Frozen
from libs.records import FaultRecord as Fault  # the book keeps the bucket's records

Scope = Literal["node", "job"]


class FaultRule(Frozen):
    kind: str = Field(description="heartbeat_missed, probe_failed (or probe:<catalogue fault "
                                  "kind> for one health probe's), bench_failed, "
                                  "worker_infra_exit, alert:<lens rule>, or condition:<NotReady, "
                                  "MemoryPressure, DiskPressure, PIDPressure, NetworkUnavailable>")
    scope: Scope = "node"
    consecutive: int = Field(default=1, ge=1, description="bad observations in a row to open")
    failover: bool = Field(default=True, description="act (quarantine / restart; on Kubernetes "
                           "also cordon and taint the node) or only record")
    close_on_clear: bool = Field(
        default=False, description="the source saying healthy again closes the fault (a "
        "node's then returns through bench at once); otherwise a node's fault closes when "
        "the node passes bench again, or when an operator closes it")


class FailoverRules(Frozen):
    rules: list[FaultRule] = Field(default_factory=lambda: list(DEFAULT_RULES))
    # Exit codes that point at the machine rather than the job's code: bus
    # errors (memory hardware) and aborts (HIP/RCCL abort on device errors),
    # as a signal (negative) or 128+signal from a shell. Kills (-9, 137) are
    # not counted: the platform's own hard stops look the same, and a dead
    # node is caught by its heartbeats.
    infra_exit_codes: list[int] = Field(default_factory=lambda: [-7, 135, -6, 134])

    def rule(self, kind: str) -> FaultRule | None:
        return next((r for r in self.rules if r.kind == kind), None)


def bench_fault_kind(rules: FailoverRules, *, probe: bool, fault_kind: str | None) -> str:
    """The fault kind a failing bench result observes: a probe's report is
    ``probe_failed``, or ``probe:<its catalogue kind>`` where an operator's
    rule names that kind; a bench run's verdict is ``bench_failed``. Pure."""
    if not probe:
        return "bench_failed"
    if fault_kind and rules.rule(f"probe:{fault_kind}") is not None:
        return f"probe:{fault_kind}"
    return "probe_failed"


DEFAULT_RULES: tuple[FaultRule, ...] = (
    FaultRule(kind="heartbeat_missed"),
    # The agent reports a probe only after its own failing streak
    # (failures_before_report): one report is enough here.
    FaultRule(kind="probe_failed"),
    FaultRule(kind="bench_failed"),
    FaultRule(kind="worker_infra_exit", consecutive=2),
    FaultRule(kind="alert:job_hang", scope="job"),
    FaultRule(kind="alert:loss_nonfinite", scope="job"),
    FaultRule(kind="alert:throughput_low", scope="job", failover=False),
    FaultRule(kind="alert:gpu_temp_high", failover=False),
    # Kubernetes node conditions (the node watch). A node that was NotReady
    # returns through bench; a pressure the kubelet reports gone closes its
    # fault, and bootstrap benches the node at once.
    FaultRule(kind="condition:NotReady"),
    FaultRule(kind="condition:MemoryPressure", close_on_clear=True),
    FaultRule(kind="condition:DiskPressure", close_on_clear=True),
    FaultRule(kind="condition:PIDPressure", close_on_clear=True),
    FaultRule(kind="condition:NetworkUnavailable", close_on_clear=True),
)


def infra_rule(kind: str, fault_class: str | None, *, about_job: bool) -> FaultRule | None:
    """The rule for a Lens log alert the configuration does not name. One of
    class infra (an RCCL timeout, an RDMA error, a GPU hardware error) is a
    fault source: about its job (restart it from its checkpoint) or, for a
    node-scoped rule, its node (take it out, move its jobs). A user-class
    one (a traceback, an out-of-memory) is the job's own: the scheduler's
    retry rule handles it, and there is no rule."""
    if fault_class != "infra":
        return None
    return FaultRule(kind=kind, scope="job" if about_job else "node")


def classify_exit(code: int, infra_codes: list[int]) -> Literal["ok", "infra", "user"]:
    """A worker's exit: clean, killed by the infrastructure, or the job's own error."""
    if code == 0:
        return "ok"
    return "infra" if code in infra_codes else "user"


@dataclass(frozen=True)
class Decision:
    action: Literal["open", "mitigate", "close", "restart_job", "recovered"]
    fault: Fault


@dataclass
class FaultBook:
    rules: FailoverRules
    streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    # job -> (step, saved at) of its newest complete checkpoint: from the
    # SDK's reports or the directory watch (job.checkpoint), whichever.
    checkpoints: dict[str, tuple[int, float]] = field(default_factory=dict)

    def checkpoint(self, job: str, iteration: int, saved_at: float) -> None:
        known = self.checkpoints.get(job)
        if known is None or (iteration, saved_at) > known:
            self.checkpoints[job] = (iteration, saved_at)

    def active(self, kind: str, key: str) -> Fault | None:
        return next((f for f in self.faults.values()
                     if f.kind == kind and f.key == key and f.status != "closed"), None)

    def observe(self, kind: str, key: str, *, bad: bool, now: float, reason: str = "",
                jobs: list[str] | None = None, last_good: float | None = None,
                default: FaultRule | None = None) -> list[Decision]:
        """One observation; a fault opens when the rule's streak is reached,
        and a good one closes it when the rule says ``close_on_clear``.
        ``default``: the rule when the configuration has none for ``kind``."""
        rule = self.rules.rule(kind) or default
        if rule is None:
            return []
        if not bad:
            self.streaks.pop((kind, key), None)
            open_fault = self.active(kind, key)
            if not rule.close_on_clear or open_fault is None:
                return []
            open_fault.status, open_fault.closed_at = "closed", now
            open_fault.close_reason = reason or "the source reports it healthy again"
            return [Decision("close", open_fault)]
        streak = self.streaks[(kind, key)] = self.streaks.get((kind, key), 0) + 1
        if streak < rule.consecutive or self.active(kind, key) is not None:
            return []
        jobs = sorted(jobs or ([key] if rule.scope == "job" else []))
        fault = Fault(fault_id=f"{kind.replace(':', '-')}-{key}-{int(now * 1000)}", kind=kind,
                      scope=rule.scope, key=key, reason=reason, jobs=jobs, failover=rule.failover,
                      last_good=now if last_good is None else last_good, opened_at=now)
        for job in jobs:  # what the fault costs each job: redone since its checkpoint
            if job in self.checkpoints:
                step, saved_at = self.checkpoints[job]
                fault.resume_step[job] = step
                fault.lost_work_s[job] = round(max(0.0, fault.last_good - saved_at), 3)
        self.faults[fault.fault_id] = fault
        decisions = [Decision("open", fault)]
        if rule.scope == "job" and rule.failover:
            fault.status, fault.mitigated_at = "mitigated", now
            decisions.append(Decision("restart_job", fault))
        return decisions

    def node_state(self, node: str, state: str, now: float) -> list[Decision]:
        """Bootstrap moved a node: out of service mitigates its faults; back
        to ready (it passed bench again) closes them."""
        out = []
        for fault in self.faults.values():
            if fault.scope != "node" or fault.key != node or fault.status == "closed":
                continue
            if state != "ready" and fault.status == "opened":
                fault.status, fault.mitigated_at = "mitigated", now
                out.append(Decision("mitigate", fault))
            elif state == "ready":
                fault.status, fault.closed_at = "closed", now
                out.append(Decision("close", fault))
        return out

    def close(self, fault_id: str, now: float, *, by: str = "", reason: str = ""
              ) -> list[Decision]:
        """An operator closes a fault (fixed, or never real). A closed fault
        stays closed; its node comes back through bench (bootstrap)."""
        fault = self.faults.get(fault_id)
        if fault is None or fault.status == "closed":
            return []
        fault.status, fault.closed_at = "closed", now
        fault.closed_by, fault.close_reason = by, reason
        self.streaks.pop((fault.kind, fault.key), None)
        return [Decision("close", fault)]

    def job_placed(self, job: str, attempt: int, now: float) -> None:
        """A job a fault moved was placed again (its first placement after)."""
        for fault in self.faults.values():
            if _ended(fault):
                continue
            if job in fault.jobs and fault.failover and job not in fault.replaced_at \
                    and now >= fault.opened_at:
                fault.replaced_at[job], fault.replaced_attempt[job] = now, attempt

    def forget_job(self, job: str) -> None:
        self.checkpoints.pop(job, None)

    def job_ended(self, job: str, now: float) -> list[Decision]:
        """The run a fault was about is over: ``job`` completed, failed, or
        was preempted (a later placement is a fresh run, judged afresh).
        Nothing is left to recover, so every fault about the job itself
        closes (node faults that list it close when their node passes bench
        again)."""
        out = []
        for fault in self.faults.values():
            if fault.scope == "job" and fault.key == job and fault.status != "closed":
                fault.status, fault.closed_at = "closed", now
                out.append(Decision("close", fault))
        return out

    def job_stepped(self, job: str, attempt: int, now: float) -> list[Decision]:
        """A training step of ``job``; the first one of its new attempt ends
        the recovery of every fault that moved it."""
        out = []
        for fault in self.faults.values():
            if _ended(fault) or job in fault.first_step_at \
                    or attempt < fault.replaced_attempt.get(job, 1 << 30):
                continue
            fault.first_step_at[job] = now
            if len(fault.first_step_at) == len(fault.jobs):
                if fault.scope == "job":
                    fault.status, fault.closed_at = "closed", now
                out.append(Decision("recovered", fault))
        return out


def _ended(fault: Fault) -> bool:
    """A job's fault that is closed has nothing left to time: a later
    placement or step of that job belongs to another run. (A node's closed
    fault still times the recovery of the jobs it moved.)"""
    return fault.scope == "job" and fault.status == "closed"
