"""Node conditions as a fault source, and which cordons the nodes should
carry (pure: no I/O).

The node watch (``libs/drivers/nodes.py``) reports what each node says;
``ConditionTracker`` turns that into changes — a condition that went bad or
cleared — so a node status the kubelet rewrites every few seconds is not an
observation each time. A node seen for the first time reports every
condition it has, good ones too (a fault left open while failover was away
closes if its rule says so). Each change is an observation of the fault
kind ``condition:<name>`` (NotReady, MemoryPressure, DiskPressure,
PIDPressure, NetworkUnavailable), judged by the rules in ``faults.py``.
A fault an operator closes while its condition still holds is judged
again at once (``still_bad``): as on Kubernetes, where the node lifecycle
controller puts back a NotReady taint someone removed, the evidence
stands until the kubelet says otherwise.

``marks_to_fix`` compares the marks a node carries with the faults open on
it, so that a cordon lost in a crash (a fault closed, its uncordon never
sent; or opened, its cordon never sent) is put right when the watch lists
every node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from libs.drivers.nodes import NodeView, fault_mark
from services.failover.faults import Fault

PREFIX = "condition:"


def condition_kind(condition: str) -> str:
    return PREFIX + condition


@dataclass(frozen=True)
class ConditionChange:
    node: str
    kind: str  # condition:<name>
    bad: bool
    message: str


@dataclass
class ConditionTracker:
    seen: dict[str, dict[str, bool]] = field(default_factory=dict)  # node -> condition -> bad
    messages: dict[str, dict[str, str]] = field(default_factory=dict)

    def update(self, view: NodeView) -> list[ConditionChange]:
        """What changed on ``view.name`` since it was last seen (all of it, the first time)."""
        before = self.seen.get(view.name, {})
        self.seen[view.name] = dict(view.conditions)
        self.messages[view.name] = dict(view.messages)
        return [ConditionChange(view.name, condition_kind(c), bad, view.messages.get(c, ""))
                for c, bad in sorted(view.conditions.items()) if before.get(c) != bad]

    def current(self, node: str) -> list[ConditionChange]:
        """Every condition of ``node`` as last seen (to judge a node registered later)."""
        messages = self.messages.get(node, {})
        return [ConditionChange(node, condition_kind(c), bad, messages.get(c, ""))
                for c, bad in sorted(self.seen.get(node, {}).items())]

    def still_bad(self, node: str, kind: str) -> ConditionChange | None:
        """The condition of fault kind ``kind`` on ``node``, if it was bad
        when last seen: an operator closed its fault, but the kubelet still
        says so, and the watch only reports changes."""
        condition = kind.removeprefix(PREFIX)
        if not kind.startswith(PREFIX) or not self.seen.get(node, {}).get(condition):
            return None
        return ConditionChange(node, kind, True, self.messages.get(node, {}).get(condition, ""))

    def forget(self, node: str) -> None:
        self.seen.pop(node, None)
        self.messages.pop(node, None)

    def keep_only(self, nodes: Iterable[str]) -> None:
        """A complete listing: a node not in it is gone."""
        for node in set(self.seen) - set(nodes):
            self.forget(node)


def cordons(fault: Fault) -> bool:
    """A node's fault that acts keeps the node cordoned while it is open."""
    return fault.scope == "node" and fault.failover


@dataclass(frozen=True)
class MarkFix:
    action: Literal["cordon", "uncordon"]
    node: str
    kind: str  # the fault kind (cordon) or the mark found on the node (uncordon)
    reason: str = ""


def wanted_marks(faults: Iterable[Fault]) -> dict[str, dict[str, Fault]]:
    """Per node, the marks its open faults keep on it, each with its fault."""
    wanted: dict[str, dict[str, Fault]] = {}
    for f in faults:
        if f.status != "closed" and cordons(f):
            wanted.setdefault(f.key, {})[fault_mark(f.kind)] = f
    return wanted


def mark_stays(closed: Fault, faults: Iterable[Fault]) -> bool:
    """Whether the mark of ``closed`` stays on its node: another open fault
    there keeps the same one (its condition still held, so it opened again)."""
    return fault_mark(closed.kind) in wanted_marks(faults).get(closed.key, {})


def marks_to_fix(views: Iterable[NodeView], faults: Iterable[Fault]) -> list[MarkFix]:
    """Cordons the nodes should have and lack, and marks they carry for no
    open fault, over a complete listing of nodes."""
    wanted = wanted_marks(faults)
    out: list[MarkFix] = []
    for view in sorted(views, key=lambda v: v.name):
        want = wanted.get(view.name, {})
        out += [MarkFix("cordon", view.name, f.kind, f.reason)
                for mark, f in sorted(want.items()) if mark not in view.marks]
        out += [MarkFix("uncordon", view.name, mark)
                for mark in sorted(view.marks) if mark not in want]
    return out
