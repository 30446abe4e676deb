"""When a quarantined node is benched again (services/bootstrap/rebench.py)."""

from __future__ import annotations

from libs.inventory import HostSpec
from libs.records import NodeRecord
from services.bootstrap import rebench
from services.bootstrap.rebench import RebenchPolicy

POLICY = RebenchPolicy(first_s=60, max_interval_s=300, attempts=4)


def node(state: str = "quarantined", **kw: object) -> NodeRecord:
    return NodeRecord(spec=HostSpec(name="n", ip="10.0.0.1", gpu_model="cpu", gpu_count=1),
                      state=state, **kw)  # type: ignore[arg-type]


def test_retries_back_off_to_a_cap_and_stop_after_the_last_attempt() -> None:
    record = rebench.on_quarantine(node(), 1000.0, POLICY)
    assert record.next_rebench_at == 1060.0 and record.rebench_attempts == 0
    assert rebench.due(record, 1059.0, POLICY) is None
    tries, now = [], 1060.0
    while (moved := rebench.due(record, now, POLICY)) is not None:
        tries.append((now, moved.rebench_attempts))
        record = moved
        now = record.next_rebench_at if record.next_rebench_at is not None else now + 10_000
    # 60 s, then 120 s, 240 s, 300 s (capped) between tries; four tries in all
    assert tries == [(1060.0, 1), (1180.0, 2), (1420.0, 3), (1720.0, 4)]
    assert record.next_rebench_at is None  # waits for an operator now
    assert rebench.on_ready(record).rebench_attempts == 0


def test_a_held_or_healthy_node_is_left_alone() -> None:
    due = rebench.on_quarantine(node(), 0.0, POLICY)
    assert rebench.due(due.model_copy(update={"cordoned": True}), 100.0, POLICY) is None
    assert rebench.due(due.model_copy(update={"state": "ready"}), 100.0, POLICY) is None
    never = RebenchPolicy(attempts=0)
    assert rebench.on_quarantine(node(), 0.0, never).next_rebench_at is None
