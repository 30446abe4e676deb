"""The onboarding state machine as scenarios: a trigger sequence and the
states a node passes through."""

from __future__ import annotations

import pytest

from services.bootstrap.onboarding import Trigger, run, step


@pytest.mark.parametrize(("name", "start", "triggers", "states"), [
    ("embedded: no provisioning", "registered",
     ["bench_requested", "bench_passed"], ["registered", "preflight", "ready"]),
    ("provisioned cluster", "registered",
     ["provision_started", "provision_succeeded", "bench_requested", "bench_passed"],
     ["registered", "provisioning", "provisioned", "preflight", "ready"]),
    ("bench fails, repaired, passes", "registered",
     ["provision_started", "provision_succeeded", "bench_requested", "bench_failed",
      "repair_started", "bench_requested", "bench_passed"],
     ["registered", "provisioning", "provisioned", "preflight", "quarantined", "repair",
      "preflight", "ready"]),
    ("quarantined, re-benched: fails once, then passes", "ready",
     ["fault_opened", "repair_started", "bench_failed", "repair_started", "bench_passed"],
     ["ready", "quarantined", "repair", "quarantined", "repair", "ready"]),
    ("a fault during the re-bench", "repair", ["fault_opened"], ["repair", "quarantined"]),
    ("provisioning fails, retried", "registered",
     ["provision_started", "provision_failed", "provision_started", "provision_succeeded"],
     ["registered", "provisioning", "quarantined", "provisioning", "provisioned"]),
    ("fault while ready", "ready", ["fault_opened", "bench_passed"],
     ["ready", "quarantined", "ready"]),
    ("a bench verdict cannot skip provisioning", "provisioning",
     ["bench_passed", "bench_requested"], ["provisioning"]),
    ("removal drains from any state", "ready", ["drain_requested", "bench_passed"],
     ["ready", "draining"]),
    ("draining ignores faults", "draining", ["fault_opened", "drain_requested"], ["draining"]),
])
def test_scenario(name: str, start: str, triggers: list[Trigger], states: list[str]) -> None:
    assert run(start, triggers) == states, name  # type: ignore[arg-type]


def test_no_change_is_none_and_reasons_default_to_the_trigger() -> None:
    assert step("ready", "bench_passed") is None
    moved = step("quarantined", "repair_started")
    assert moved is not None and moved.reason == "repair started"
