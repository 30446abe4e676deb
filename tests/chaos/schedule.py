"""The seeded kill schedule of a chaos run (pure: the seed decides it all).

Each run kills, in a random order, a node (its agent and workers), one
worker process of the job, the scheduler, nats-server, the bench agent of
one of the job's nodes (its workers keep running: stopped cleanly or
SIGKILLed, as a DaemonSet rollout or a crash would) and one of the other
services (failover, the Lens collector, the bench coordinator, bootstrap),
and mixes in what an operator does on a normal day: upgrades the platform
(every service and agent stopped and started again at once, the workers
running on), stops the job and resumes it, or drains one of its nodes.
Every kind comes once in the first ``len(KINDS)`` strikes, then random
kinds. A killed service is restarted, and a stopped job resumed, after a
random outage. A strike comes a random pause after the job made visible
progress since the last one, or, when it ``hurries``, that pause after the
last strike itself: into the middle of a recovery, where the races are. A
node that dies stays dead and a drained node stays cordoned, so at most
``spare_nodes`` of those are drawn: the gang must still fit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["node", "worker", "scheduler", "nats", "agent", "service", "upgrade", "stop",
               "drain"]
KINDS: tuple[Kind, ...] = ("node", "worker", "scheduler", "nats", "agent", "service", "upgrade",
                           "stop", "drain")
# Kinds that take a node away for the rest of the run.
TAKES_A_NODE: frozenset[Kind] = frozenset({"node", "drain"})


@dataclass(frozen=True)
class Kill:
    kind: Kind
    delay_s: float  # pause after the job made progress since the last kill
    down_s: float  # how long a killed service stays down
    hurry: bool  # do not wait for progress: strike during the last recovery
    pick: float  # which target, as a fraction of the sorted candidates

    def choose(self, candidates: list[str]) -> str:
        ordered = sorted(candidates)
        return ordered[min(len(ordered) - 1, int(self.pick * len(ordered)))]


def plan_kills(seed: int, count: int, *, spare_nodes: int) -> list[Kill]:
    rng = random.Random(seed)
    kinds: list[Kind] = []

    def fits(kind: Kind) -> bool:
        return kind not in TAKES_A_NODE or sum(k in TAKES_A_NODE for k in kinds) < spare_nodes

    for kind in rng.sample(KINDS, len(KINDS)):
        if fits(kind):
            kinds.append(kind)
    while len(kinds) < count:
        kind = rng.choice(KINDS)
        if fits(kind):
            kinds.append(kind)
    return [Kill(kind, delay_s=round(rng.uniform(0.0, 3.0), 2),
                 down_s=round(rng.uniform(0.3, 6.0), 2), pick=rng.random(),
                 hurry=i > 0 and rng.random() < 0.4)
            for i, kind in enumerate(kinds[:count])]
