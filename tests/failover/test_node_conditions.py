"""Node conditions as a fault source, and the cordon patches (pure):
scenarios as data."""

from __future__ import annotations

from typing import Any

import pytest

from libs.drivers.k8s_nodes import CORDONED, cordon_patch, read_node, uncordon_patch
from libs.drivers.nodes import NodeView, fault_mark
from services.failover.conditions import ConditionTracker, MarkFix, mark_stays, marks_to_fix
from services.failover.faults import DEFAULT_RULES, FailoverRules, Fault, FaultBook, FaultRule


def k8s_node(*, ready: str = "True", taints: list[dict[str, Any]] | None = None,
             unschedulable: bool = False, annotations: dict[str, str] | None = None,
             **conditions: str) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": "gpu-1", "resourceVersion": "7",
                         "annotations": annotations or {}},
            "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": ready, "message": "kubelet"},
                                      {"type": "OutOfDisk", "status": "True"},  # not watched
                                      *({"type": k, "status": v} for k, v in
                                        conditions.items())]}}


@pytest.mark.parametrize(("ready", "conditions", "bad"), [
    ("True", {}, {"NotReady": False}),
    ("False", {}, {"NotReady": True}),
    ("Unknown", {}, {"NotReady": True}),
    ("True", {"MemoryPressure": "True", "DiskPressure": "False", "PIDPressure": "True",
              "NetworkUnavailable": "True"},
     {"NotReady": False, "MemoryPressure": True, "DiskPressure": False, "PIDPressure": True,
      "NetworkUnavailable": True}),
])
def test_read_node_names_the_bad_conditions(ready: str, conditions: dict[str, str],
                                            bad: dict[str, bool]) -> None:
    assert read_node(k8s_node(ready=ready, **conditions)).conditions == bad


PLATFORM = {"key": "primus-safe/fault-heartbeat_missed", "value": "", "effect": "NoSchedule"}
OTHER = {"key": "amd.com/gpu", "effect": "NoSchedule"}


def test_cordon_patch_adds_the_taint_and_the_cordon_once() -> None:
    patch = cordon_patch(k8s_node(taints=[OTHER]), "heartbeat_missed", "silent")
    assert patch == {"metadata": {"resourceVersion": "7", "annotations": {
        CORDONED: "true", "primus-safe/fault-heartbeat_missed": "heartbeat_missed: silent"}},
        "spec": {"taints": [OTHER, PLATFORM], "unschedulable": True}}
    assert cordon_patch(k8s_node(taints=[PLATFORM], unschedulable=True),
                        "heartbeat_missed", "again") is None
    # Cordoned by hand: only the taint, and no claim on the cordon.
    by_hand = cordon_patch(k8s_node(unschedulable=True), "bench_failed", "slow")
    assert by_hand is not None and "unschedulable" not in by_hand["spec"]
    assert CORDONED not in by_hand["metadata"]["annotations"]


def test_uncordon_patch_removes_only_the_platforms_taint_and_its_cordon_last() -> None:
    temp = {"key": "primus-safe/fault-alert-gpu_temp_high", "value": "", "effect": "NoSchedule"}
    ours = {CORDONED: "true"}
    two = k8s_node(taints=[OTHER, PLATFORM, temp], unschedulable=True, annotations=ours)
    first = uncordon_patch(two, "heartbeat_missed")
    assert first is not None and first["spec"] == {"taints": [OTHER, temp]}  # still cordoned
    last = uncordon_patch(k8s_node(taints=[OTHER, temp], unschedulable=True, annotations=ours),
                          "alert:gpu_temp_high")
    assert last is not None and last["spec"] == {"taints": [OTHER], "unschedulable": None}
    assert last["metadata"]["annotations"][CORDONED] is None
    # An operator's cordon stays; nothing to do is no patch.
    by_hand = uncordon_patch(k8s_node(taints=[PLATFORM], unschedulable=True), "heartbeat_missed")
    assert by_hand is not None and by_hand["spec"] == {"taints": None}
    assert uncordon_patch(k8s_node(taints=[OTHER]), "heartbeat_missed") is None


def test_fault_marks_are_valid_taint_names() -> None:
    assert fault_mark("alert:gpu_temp_high") == "alert-gpu_temp_high"
    assert fault_mark("condition:NotReady") == "condition-NotReady"
    assert len(fault_mark("x" * 200)) <= 50 and fault_mark(":::") == "fault"


def view(name: str, marks: set[str] = frozenset(), **conditions: bool) -> NodeView:  # type: ignore[assignment]
    return NodeView(name=name, conditions=conditions, messages={c: f"{c} says"
                                                                for c in conditions},
                    marks=frozenset(marks))


def test_the_tracker_reports_changes_and_everything_at_first_sight() -> None:
    tracker = ConditionTracker()
    first = tracker.update(view("n1", NotReady=False, MemoryPressure=True))
    assert [(c.kind, c.bad) for c in first] == [("condition:MemoryPressure", True),
                                                ("condition:NotReady", False)]
    assert tracker.update(view("n1", NotReady=False, MemoryPressure=True)) == []
    assert [(c.kind, c.bad, c.message) for c in
            tracker.update(view("n1", NotReady=True, MemoryPressure=True))] == [
        ("condition:NotReady", True, "NotReady says")]
    tracker.keep_only(["n2"])  # a complete listing without n1: it is gone
    assert tracker.current("n1") == []


def test_a_condition_still_bad_is_found_for_a_fault_closed_over_it() -> None:
    tracker = ConditionTracker()
    tracker.update(view("n1", NotReady=True, MemoryPressure=False))
    bad = tracker.still_bad("n1", "condition:NotReady")
    assert bad is not None and (bad.node, bad.kind, bad.bad, bad.message) == (
        "n1", "condition:NotReady", True, "NotReady says")
    assert tracker.still_bad("n1", "condition:MemoryPressure") is None  # cleared
    assert tracker.still_bad("n1", "condition:PIDPressure") is None  # never reported
    assert tracker.still_bad("n2", "condition:NotReady") is None  # unknown node
    assert tracker.still_bad("n1", "heartbeat_missed") is None  # not a condition


RULES = FailoverRules()


@pytest.mark.parametrize(("kind", "close_on_clear"), [
    ("condition:NotReady", False), ("condition:MemoryPressure", True),
    ("condition:DiskPressure", True), ("condition:PIDPressure", True),
    ("condition:NetworkUnavailable", True)])
def test_condition_rules_by_default(kind: str, close_on_clear: bool) -> None:
    rule = RULES.rule(kind)
    assert rule is not None and rule.scope == "node" and rule.failover
    assert rule.close_on_clear is close_on_clear and rule.consecutive == 1
    book = FaultBook(RULES)
    [opened] = book.observe(kind, "n1", bad=True, now=1.0, reason="bad")
    assert opened.action == "open" and opened.fault.failover
    cleared = book.observe(kind, "n1", bad=False, now=2.0)
    assert [d.action for d in cleared] == (["close"] if close_on_clear else [])
    assert (book.active(kind, "n1") is None) is close_on_clear


def test_close_on_clear_is_configuration_and_other_kinds_keep_their_lives() -> None:
    rules = FailoverRules(rules=[FaultRule(kind="condition:NotReady", close_on_clear=True)])
    book = FaultBook(rules)
    book.observe("condition:NotReady", "n1", bad=True, now=1.0)
    [closed] = book.observe("condition:NotReady", "n1", bad=False, now=2.0, reason="Ready")
    assert closed.fault.status == "closed" and closed.fault.close_reason == "Ready"
    assert book.observe("condition:DiskPressure", "n1", bad=True, now=3.0) == []  # no rule
    # heartbeat_missed still closes only through bench (node_state) or an operator.
    default = FaultBook(FailoverRules())
    default.observe("heartbeat_missed", "n1", bad=True, now=1.0)
    assert default.observe("heartbeat_missed", "n1", bad=False, now=2.0) == []
    assert all(not r.close_on_clear for r in DEFAULT_RULES
               if not r.kind.startswith("condition:"))


def fault(kind: str, node: str, *, status: str = "opened", failover: bool = True) -> Fault:
    return Fault(fault_id=f"{kind}-{node}", kind=kind, scope="node", key=node, reason="why",
                 failover=failover, last_good=0.0, opened_at=0.0, status=status)  # type: ignore[arg-type]


def test_marks_are_put_right_from_a_complete_listing() -> None:
    faults = [fault("heartbeat_missed", "n1"),  # open, its cordon lost: cordon
              fault("condition:NotReady", "n1"),  # open and marked: nothing
              fault("bench_failed", "n2", status="closed"),  # closed, mark left: uncordon
              fault("alert:gpu_temp_high", "n3", failover=False)]  # records only: no mark
    views = [view("n1", {"condition-NotReady"}), view("n2", {"bench_failed"}), view("n3"),
             view("n4", {"probe_failed"})]  # a mark no fault knows: uncordon
    assert marks_to_fix(views, faults) == [
        MarkFix("cordon", "n1", "heartbeat_missed", "why"),
        MarkFix("uncordon", "n2", "bench_failed"),
        MarkFix("uncordon", "n4", "probe_failed"),
    ]


def test_a_closed_faults_mark_stays_while_an_open_fault_keeps_the_same_one() -> None:
    closed = fault("condition:NotReady", "n1", status="closed")
    again = fault("condition:NotReady", "n1").model_copy(update={"fault_id": "again"})
    assert mark_stays(closed, [closed, again])  # its condition held: opened again
    assert not mark_stays(closed, [closed])
    assert not mark_stays(closed, [closed, fault("condition:NotReady", "n2")])  # another node
    assert not mark_stays(closed, [closed, fault("heartbeat_missed", "n1")])  # another mark
    recorded = fault("condition:NotReady", "n1", failover=False)  # records only: no mark
    assert not mark_stays(closed, [closed, recorded])
