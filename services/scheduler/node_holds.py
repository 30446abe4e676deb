"""Nodes a driver found down before failover judged them (pure).

Failover takes a node out of service only after its heartbeat deadline (or,
for an agent that announced a restart, after its grace: two minutes by
default). A gang placed on such a node in between (a resume, a queued job)
cannot start there: the driver says so in the rank's exit (``node_down``).
The job spends no retry on it, and the scheduler holds the node out of
placement for a while so that the next attempt goes elsewhere, or waits,
rather than landing on the dead node again at once.

The hold is the scheduler's own note, not a node state: it does not cordon
anything, it ends by itself, and failover's verdict (any state change of the
node, or a new registration) replaces it. A node that refuses again while
held, or soon after, is held twice as long (the scheduler's retry back-off:
5 s doubling to 5 min), so a node that stays dead without a verdict costs a
few attempts, not a loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from services.scheduler.lifecycle import Limits


@dataclass(frozen=True)
class Hold:
    until: float  # out of placement until then
    streak: int  # refusals in a row: the next hold is twice as long
    reason: str  # what the driver said


def refused(holds: Mapping[str, Hold], node: str, now: float, reason: str,
            limits: Limits) -> dict[str, Hold]:
    """The driver could not start a rank on ``node``: hold it for the
    back-off of this streak (``Limits.backoff_s``). A refusal while the
    node is held changes nothing (it comes from a placement made before the
    hold: another rank of that gang, a redelivery). One more than the
    back-off's cap after the last hold ended starts a new streak (the node
    had come back in between)."""
    last = holds.get(node)
    if last is not None and now < last.until:
        return dict(holds)
    streak = (1 if last is None or now > last.until + limits.backoff_cap_s
              else last.streak + 1)
    return {**holds, node: Hold(until=now + limits.backoff_s(streak), streak=streak,
                                reason=reason)}


def judged(holds: Mapping[str, Hold], node: str) -> dict[str, Hold]:
    """Failover's verdict on the node (or its agent registering again): the
    node's own state says from now on whether it can be used."""
    return {n: h for n, h in holds.items() if n != node}


def active(holds: Mapping[str, Hold], now: float) -> dict[str, Hold]:
    """The holds still in force at ``now``."""
    return {n: h for n, h in holds.items() if h.until > now}


def held(holds: Mapping[str, Hold], now: float) -> frozenset[str]:
    """The nodes out of placement at ``now``."""
    return frozenset(active(holds, now))


def note(holds: Mapping[str, Hold], now: float, shown: int = 3) -> str:
    """What a waiting job's reason adds while nodes are held ("" when none
    is): which, why and until when, so that a gang that waits for a node
    that looks ready says what keeps it off."""
    now_held = sorted(active(holds, now).items())
    if not now_held:
        return ""
    named = ", ".join(f"{n} until {time.strftime('%H:%M:%S', time.gmtime(h.until))} UTC"
                      for n, h in now_held[:shown])
    more = f" and {len(now_held) - shown} more" if len(now_held) > shown else ""
    return (f"held out of placement (a rank could not start there, failover has not judged "
            f"it yet): {named}{more}")
