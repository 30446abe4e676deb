"""The node onboarding state machine (pure).

registered → preflight → ready | quarantined; a fault sends a node to
quarantined; a quarantined node that passes bench again is ready. Only
``ready`` nodes may run jobs: bootstrap publishes each transition as
``node.state`` and the scheduler obeys it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

State = Literal["registered", "preflight", "ready", "quarantined"]
Trigger = Literal["bench_requested", "bench_passed", "bench_failed", "fault_opened"]

_NEXT: dict[tuple[State, Trigger], State] = {
    ("registered", "bench_requested"): "preflight",
    ("ready", "bench_requested"): "preflight",
    ("quarantined", "bench_requested"): "quarantined",
    ("preflight", "bench_passed"): "ready",
    ("preflight", "bench_failed"): "quarantined",
    ("quarantined", "bench_passed"): "ready",
    ("ready", "bench_failed"): "quarantined",
    ("registered", "fault_opened"): "quarantined",
    ("preflight", "fault_opened"): "quarantined",
    ("ready", "fault_opened"): "quarantined",
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
