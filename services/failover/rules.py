"""Fault detection rules (pure): no I/O, the clock is passed in.

``HeartbeatMonitor`` remembers when each node last beat and answers which
nodes are overdue: a node is down after ``missed`` intervals without a beat.
The judge looks at intervals of its own (``lead_s``): a silence that would
pass the deadline before its next look is called at this one, so a fault
opens by the deadline, never up to a look later.
A node that has never beaten is timed from its registration, so an agent that
never starts is caught too, but with ``first_beat_grace_s`` rather than the
beat deadline: an agent starting on a busy machine (imports, device probes)
is slow to say its first word, and its node runs nothing yet. Each outage
yields one fault until the node beats again. While the monitor itself cannot
hear (its bus is down) silence is no evidence: ``blind`` restarts every
node's clock at the moment it hears again.

Time is the receiver's: a beat counts when it is received, whatever its
sender stamped on it (a clock in 2099 must not keep a node alive for good,
nor an old stamp replayed after a restart kill it). A monitor that starts
is blind until then: every node gets a full deadline to beat again. Only
nodes the monitor was told about (registered with bootstrap) are judged: a
beat from any other name is counted and otherwise ignored. An agent that
stops cleanly says when it will be back (``pause``): until then its node's
silence is an agent restart, not a dead node.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MissedHeartbeat:
    node: str
    last_seen: float
    overdue_s: float


@dataclass
class HeartbeatMonitor:
    interval_s: float
    missed: int
    last_seen: dict[str, float] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)
    first_beat_grace_s: float = 0.0  # for a node never heard; 0: the beat deadline
    deaf_until: float = float("-inf")  # the monitor could hear nothing until then
    unheard: set[str] = field(default_factory=set)  # watched, never beaten
    quiet_until: dict[str, float] = field(default_factory=dict)  # announced agent stops
    unknown_beats: dict[str, int] = field(default_factory=dict)  # never registered: ignored
    stall_s: float = 0.5  # a check this late means the judge itself was not listening
    lead_s: float = 0.0  # call a silence this early: the judge's time to its next look

    def __post_init__(self) -> None:
        if not 0 <= self.lead_s < self.interval_s:
            raise ValueError(f"lead_s must be in [0, interval_s), got {self.lead_s}")

    @property
    def deadline_s(self) -> float:
        return self.interval_s * self.missed

    def watch(self, node: str, now: float, *, heard: bool = False) -> None:
        """Start timing a node (at registration) without marking it alive.
        ``heard``: it is known to have beaten before (it was in service when
        this monitor started), so it gets the beat deadline, not the grace."""
        if node in self.last_seen:
            return
        self.last_seen[node] = now
        if not heard:
            self.unheard.add(node)

    def beat(self, node: str, at: float) -> bool:
        """Record a beat received at ``at``; True when a node that was down
        came back. A node never watched is not judged: its beat is counted."""
        seen = self.last_seen.get(node)
        if seen is None:
            self.unknown_beats[node] = self.unknown_beats.get(node, 0) + 1
            return False
        if at >= seen:
            del self.last_seen[node]  # to the end: the dict stays in order of arrival
            self.last_seen[node] = at
        self.unheard.discard(node)
        self.quiet_until.pop(node, None)  # its agent is back
        if node in self.down:
            self.down.discard(node)
            return True
        return False

    def pause(self, node: str, until: float) -> None:
        """The node's agent stopped cleanly and expects to beat again by
        ``until``: its silence until then says nothing about the node."""
        if node in self.last_seen:
            self.quiet_until[node] = max(until, self.quiet_until.get(node, until))

    def blind(self, now: float) -> None:
        """The monitor could not hear beats until ``now`` (its own link to
        the bus was down): no node's silence before then counts against it."""
        self.deaf_until = max(self.deaf_until, now)

    def check(self, now: float, *, late_s: float = 0.0) -> list[MissedHeartbeat]:
        """Nodes newly overdue at ``now`` (each reported once per outage).
        ``last_seen`` is in order of arrival, so the scan stops at the first
        node heard within the deadline: a check costs the silent nodes, not
        the fleet (12,500 nodes checked twenty times a second).

        ``late_s``: how much later than planned this check runs. A judge
        that was stalled that long (a pause of its process, a starved
        machine) did not read the beats that came meanwhile either: past
        ``stall_s`` its silence counts as deafness (``blind``), not as the
        nodes' death."""
        if late_s > self.stall_s:
            self.blind(now)
            return []
        found = []
        now_ahead = now + self.lead_s  # what the next look would see
        for node, seen in self.last_seen.items():
            overdue = now - seen
            if now_ahead - seen <= self.deadline_s:
                break  # every node after it was heard later still
            if node in self.down:
                continue
            deadline = max(self.deadline_s, self.first_beat_grace_s) if node in self.unheard \
                else self.deadline_s
            heard_from = max(seen, self.deaf_until, self.quiet_until.get(node, seen))
            if now_ahead - heard_from > deadline:
                self.down.add(node)
                found.append(MissedHeartbeat(node, seen, overdue))
        return found
