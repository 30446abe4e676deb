"""Taking turns on shared hardware (pure: the caller passes the time).

When several nodes of a sweep are agents on one machine, measuring them one
after the other compares each node with a machine that has since changed
(other tenants, clocks, caches drift on every timescale). Interleaving them
— node A one timed sample, then B, then C, ... — spreads every node's samples
over the same stretch of time, so what the machine does affects all nodes
alike and the fleet comparison sees only the nodes. At most one node
measures at any moment.

The ring grants the turn to waiting nodes in ring order after the last
holder. A node that holds the turn longer than ``max_hold_s`` loses it (a
dead or stuck agent must not stall the sweep); its late release is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class TurnRing:
    order: list[str]
    max_hold_s: float = 120.0
    holder: str | None = None
    held_since: float = 0.0
    waiting: list[str] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    last: int = -1  # ring index of the last holder
    turns: int = 0

    @classmethod
    def of(cls, nodes: Sequence[str], *, max_hold_s: float = 120.0) -> TurnRing:
        return cls(list(nodes), max_hold_s)

    def acquire(self, node: str, now: float) -> list[str]:
        """``node`` asks for the turn; returns the nodes granted it now."""
        if node == self.holder:
            return [node]  # asked twice (a redelivered request): it has it
        if node not in self.waiting:
            self.waiting.append(node)
        self.gone.discard(node)
        return self._grant(now)

    def release(self, node: str, now: float) -> list[str]:
        if node == self.holder:
            self.holder = None
        return self._grant(now)

    def leave(self, node: str, now: float) -> list[str]:
        """``node`` is done with the sweep (or gave up)."""
        self.gone.add(node)
        if node in self.waiting:
            self.waiting.remove(node)
        return self.release(node, now)

    def expire(self, now: float) -> list[str]:
        if self.holder is not None and now - self.held_since > self.max_hold_s:
            self.holder = None
        return self._grant(now)

    def _grant(self, now: float) -> list[str]:
        if self.holder is not None or not self.waiting:
            return []
        size = len(self.order)

        def distance(node: str) -> int:
            index = self.order.index(node) if node in self.order else size
            return (index - self.last - 1) % (size + 1)

        chosen = min(self.waiting, key=lambda n: (distance(n), n))
        self.waiting.remove(chosen)
        self.holder, self.held_since = chosen, now
        if chosen in self.order:
            self.last = self.order.index(chosen)
        self.turns += 1
        return [chosen]
