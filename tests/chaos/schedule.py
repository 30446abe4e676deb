"""The seeded kill schedule of a chaos run (pure: the seed decides it all).

Each run kills, in a random order, a node (its agent and workers), one
worker process of the job, the scheduler, nats-server and the bench agent of
one of the job's nodes (its workers keep running: stopped cleanly or
SIGKILLed, as a DaemonSet rollout or a crash would) — every kind once in the
first five kills, then random kinds — and restarts a killed service after a
random outage. A kill comes a random pause after the job made
visible progress since the last one, or, when it ``hurries``, that pause
after the last kill itself: into the middle of a recovery, where the
races are. A node that dies stays dead, so at most ``spare_nodes`` node
kills are drawn: the gang must still fit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["node", "worker", "scheduler", "nats", "agent"]
KINDS: tuple[Kind, ...] = ("node", "worker", "scheduler", "nats", "agent")


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
    kinds: list[Kind] = [k for k in rng.sample(KINDS, len(KINDS))
                         if k != "node" or spare_nodes > 0]
    while len(kinds) < count:
        kind = rng.choice(KINDS)
        if kind != "node" or kinds.count("node") < spare_nodes:
            kinds.append(kind)
    return [Kill(kind, delay_s=round(rng.uniform(0.0, 3.0), 2),
                 down_s=round(rng.uniform(0.3, 6.0), 2), pick=rng.random(),
                 hurry=i > 0 and rng.random() < 0.4)
            for i, kind in enumerate(kinds[:count])]
