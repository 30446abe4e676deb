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
silence is an agent restart, not a dead node. One killed outright says
nothing; while the driver says its node's workers run, the node is a
``WatchedNode``, not a dead one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MissedHeartbeat:
    node: str
    last_seen: float
    overdue_s: float


@dataclass(slots=True)
class WatchedNode:
    """A node whose agent fell silent while the driver saw its workers run,
    or could not say: watched, not evacuated, and the driver asked again
    every so often.

    The driver answers through the scheduler, so right after a NATS or
    scheduler restart nobody answers for a moment (chaos runs evacuated
    nodes whose agents were restarting: 0.4 s after NATS came back, and
    while the scheduler restarted too), and without a scheduler nothing
    could be moved anyway. So no word keeps the node watched; the driver
    saying the workers stopped, or no word that they run for
    ``no_word_s``, opens its fault."""

    missed: MissedHeartbeat
    asked: float
    """When the driver was last asked (monotonic s)."""
    seen_running: float
    """When it last said the workers run (monotonic s); the node's last beat
    when it has said nothing yet."""

    @classmethod
    def first(cls, missed: MissedHeartbeat, alive: bool | None, now: float,
              wall_now: float) -> WatchedNode | None:
        """The watch that the driver's first answer on a newly silent node
        starts (``now`` monotonic, ``wall_now`` the wall clock of
        ``missed.last_seen``); None when its workers stopped: open its fault
        now. No word counts as running until the node's last beat."""
        if alive is False:
            return None
        seen = now if alive else now - max(0.0, wall_now - missed.last_seen)
        return cls(missed, asked=now, seen_running=seen)

    def due(self, now: float, every_s: float) -> bool:
        return now - self.asked >= every_s

    def answered(self, alive: bool | None, now: float, no_word_s: float) -> str:
        """Take the driver's answer (None: no word); "" to keep watching,
        else what the fault's reason adds."""
        self.asked = now
        if alive:
            self.seen_running = now
            return ""
        if alive is False:
            return "; its workers have stopped too"
        unheard_s = now - self.seen_running
        return f"; no word on its workers for {unheard_s:.0f} s" if unheard_s >= no_word_s else ""


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

    def judge_again(self, node: str, now: float) -> None:
        """An operator closed the fault of the node's silence. A node reported
        down is reported once per outage, so without this a node still silent
        would sit out of service with nothing open, for good; instead it gets
        one deadline from ``now`` to beat, and is reported again if it does
        not."""
        if node in self.down:
            self.down.discard(node)
            self.quiet_until[node] = max(now, self.quiet_until.get(node, now))

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
