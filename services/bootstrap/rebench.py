"""When a quarantined node is benched again (pure: the clock is passed in).

A node the platform took out of service comes back by itself: bootstrap
moves it to ``repair`` and asks its agent to bench it again after
``first_s``, then after twice that, and so on up to ``max_interval_s``, at
most ``attempts`` times (0: never).
A pass returns it to ``ready``; after the last failed try it stays
quarantined until an operator acts (``primus-safe bench run``, ``fault
close``). A node an operator cordoned is left alone: the hold is theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.records import NodeRecord


@dataclass(frozen=True)
class RebenchPolicy:
    first_s: float = 60.0
    max_interval_s: float = 3600.0
    attempts: int = 10

    def interval_s(self, attempt: int) -> float:
        """The wait before try ``attempt`` (1-based)."""
        return min(self.max_interval_s, self.first_s * 2 ** max(0, attempt - 1))


def on_quarantine(record: NodeRecord, now: float, policy: RebenchPolicy) -> NodeRecord:
    """The node just left service: its first re-bench is due after ``first_s``."""
    return record.model_copy(update={
        "rebench_attempts": 0,
        "next_rebench_at": now + policy.interval_s(1) if policy.attempts > 0 else None})


def on_ready(record: NodeRecord) -> NodeRecord:
    return record.model_copy(update={"rebench_attempts": 0, "next_rebench_at": None})


def due(record: NodeRecord, now: float, policy: RebenchPolicy) -> NodeRecord | None:
    """The record after starting a re-bench now, or None when none is due.
    The next try is scheduled at once: a try whose result never comes (its
    agent is down) is superseded by the next."""
    if record.state not in ("quarantined", "repair") or record.cordoned \
            or record.next_rebench_at is None \
            or now < record.next_rebench_at:
        return None
    attempt = record.rebench_attempts + 1
    last = attempt >= policy.attempts
    return record.model_copy(update={
        "rebench_attempts": attempt,
        "next_rebench_at": None if last else now + policy.interval_s(attempt + 1)})
