"""The node onboarding state machine (pure: no I/O, no clock).

A node the platform builds goes registered → provisioning → provisioned →
preflight → ready | quarantined; a quarantined node is benched again
(``repair``: bootstrap's re-bench, or an operator closed its fault) and
returns to ready when it passes, or to quarantined when it fails. In the
embedded stack (nothing to provision) a node goes registered → preflight →
ready. A node leaving the hosts file is drained
(its jobs moved away) before it is removed. Only ``ready`` nodes may run
jobs: bootstrap publishes each transition as ``node.state`` and the scheduler
obeys it (any other state is not usable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["registered", "provisioning", "provisioned", "preflight", "ready",
                "quarantined", "repair", "draining"]
Trigger = Literal["provision_started", "provision_succeeded", "provision_failed",
                  "bench_requested", "bench_passed", "bench_failed", "fault_opened",
                  "repair_started", "drain_requested"]

_NEXT: dict[tuple[State, Trigger], State] = {
    # provisioning (only for clusters the platform builds)
    ("registered", "provision_started"): "provisioning",
    ("quarantined", "provision_started"): "provisioning",
    ("repair", "provision_started"): "provisioning",
    ("provisioning", "provision_succeeded"): "provisioned",
    ("provisioning", "provision_failed"): "quarantined",
    # preflight
    ("registered", "bench_requested"): "preflight",
    ("provisioned", "bench_requested"): "preflight",
    ("ready", "bench_requested"): "preflight",
    ("repair", "bench_requested"): "preflight",
    ("preflight", "bench_passed"): "ready",
    ("preflight", "bench_failed"): "quarantined",
    # a quarantined node that passes bench again (failover's re-check) returns
    ("quarantined", "bench_passed"): "ready",
    ("ready", "bench_failed"): "quarantined",
    # faults
    ("registered", "fault_opened"): "quarantined",
    ("provisioned", "fault_opened"): "quarantined",
    ("preflight", "fault_opened"): "quarantined",
    ("ready", "fault_opened"): "quarantined",
    ("repair", "fault_opened"): "quarantined",
    # repair: a quarantined node benched again
    ("quarantined", "repair_started"): "repair",
    ("repair", "bench_passed"): "ready",
    ("repair", "bench_failed"): "quarantined",
    # removal: any state drains first
    **{(s, "drain_requested"): "draining" for s in (
        "registered", "provisioning", "provisioned", "preflight", "ready", "quarantined",
        "repair")},  # type: ignore[dict-item]
}


@dataclass(frozen=True)
class Transition:
    state: State
    reason: str


def step(current: State, trigger: Trigger, reason: str = "") -> Transition | None:
    """The next state, or None when the trigger does not change anything."""
    nxt = _NEXT.get((current, trigger))
    if nxt is None or nxt == current:
        return None
    return Transition(nxt, reason or trigger.replace("_", " "))


def run(start: State, triggers: list[Trigger]) -> list[State]:
    """The states a node passes through for a sequence of triggers (for
    scenario tests and ``plan`` explanations); ignored triggers add nothing."""
    states: list[State] = [start]
    for trigger in triggers:
        moved = step(states[-1], trigger)
        if moved is not None:
            states.append(moved.state)
    return states


# Levels bench-coordinator judges against the fleet and the peak floors.
JUDGED_LEVELS = frozenset({"standard", "full"})


def awaits_verdict(state: State, *, level: str, passed: bool, judged_by: str) -> bool:
    """Whether an agent's passing run of a judged level leaves the node in
    preflight (or repair) until the fleet verdict: a GPU slower than its
    model's floor or its fleet passes every check the agent makes itself, and
    must not take a job before the coordinator says so. Pure."""
    return (passed and judged_by == "agent" and level in JUDGED_LEVELS
            and state in ("preflight", "repair"))


def verdict_overdue(state: State, verdict_due_at: float | None, now: float) -> bool | None:
    """A node awaiting its fleet verdict past ``verdict_due_at``: True when
    its own pass should now stand (still in preflight or repair), False when
    the wait is moot (it moved on meanwhile: clear it), None when nothing is
    due. Pure."""
    if verdict_due_at is None or now < verdict_due_at:
        return None
    return state in ("preflight", "repair")
