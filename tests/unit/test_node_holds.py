"""The scheduler's hold on a node its driver found down (pure)."""

from __future__ import annotations

from libs.records import HostSpec, NodeRecord
from services.scheduler import node_holds as nh
from services.scheduler.lifecycle import Limits
from services.scheduler.view import SchedulerState, policy_nodes, snapshot

LIMITS = Limits()  # the hold follows the scheduler's retry back-off
FIRST, CAP = LIMITS.backoff_base_s, LIMITS.backoff_cap_s


def test_a_refusal_holds_the_node_and_the_hold_ends_by_itself() -> None:
    holds = nh.refused({}, "n1", 100.0, "node n1 is down", LIMITS)
    assert holds["n1"] == nh.Hold(until=100.0 + FIRST, streak=1,
                                  reason="node n1 is down")
    assert nh.held(holds, 100.0) == {"n1"}
    assert nh.held(holds, 100.0 + FIRST) == frozenset()


def test_refusals_while_held_change_nothing_and_later_ones_double_the_hold() -> None:
    holds = nh.refused({}, "n1", 100.0, "down", LIMITS)
    # Another rank of the same gang, or a redelivered exit: same hold.
    assert nh.refused(holds, "n1", 101.0, "down", LIMITS) == holds
    # Placed there after the hold: twice as long.
    again = nh.refused(holds, "n1", 106.0, "down", LIMITS)
    assert (again["n1"].streak, again["n1"].until) == (2, 106.0 + 2 * FIRST)
    streak = again
    for _ in range(20):  # dead all along, placed there each time its hold ends
        at = streak["n1"].until
        streak = nh.refused(streak, "n1", at, "down", LIMITS)
    assert streak["n1"].until - at == CAP  # capped
    # Long after the last hold ended the node had come back: a new streak.
    fresh = nh.refused(again, "n1", again["n1"].until + CAP + 1, "down", LIMITS)
    assert fresh["n1"].streak == 1


def test_failovers_verdict_ends_a_hold_and_other_nodes_are_untouched() -> None:
    holds = nh.refused(nh.refused({}, "n1", 0.0, "down", LIMITS), "n2", 0.0, "down", LIMITS)
    assert nh.judged(holds, "n1") == {"n2": holds["n2"]}
    assert nh.judged(holds, "n9") == holds


def test_a_held_node_is_not_ready_for_placement_until_its_hold_ends() -> None:
    def node(name: str) -> NodeRecord:
        spec = HostSpec(name=name, ip="10.0.0.1", gpu_model="MI300X", gpu_count=8)
        return NodeRecord(spec=spec, state="ready")

    state = SchedulerState(nodes={"n1": node("n1"), "n2": node("n2")},
                           holds=nh.refused({}, "n1", 100.0, "node n1 is down", LIMITS))
    assert [n.state for n in policy_nodes(state, held=nh.held(state.holds, 101.0))] \
        == ["unready", "ready"]
    snap, _ = snapshot(state, [], 101.0)
    assert {n.name: n.state for n in snap.nodes} == {"n1": "unready", "n2": "ready"}
    snap, _ = snapshot(state, [], 100.0 + FIRST)
    assert {n.name: n.state for n in snap.nodes} == {"n1": "ready", "n2": "ready"}


def test_a_waiting_jobs_reason_names_the_held_nodes() -> None:
    holds: dict[str, nh.Hold] = {}
    for i in range(5):
        holds = nh.refused(holds, f"n{i}", 0.0, "down", LIMITS)
    assert nh.note({}, 0.0) == "" and nh.note(holds, FIRST) == ""
    text = nh.note(holds, 1.0)
    assert text.startswith("held out of placement (a rank could not start there")
    assert "n0 until 00:00:05 UTC, n1 until" in text and text.endswith("and 2 more")
