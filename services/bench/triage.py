"""The coordinator's decisions, pure: what to do with a node's bench run
(publish a verdict or ask for a retry), which node partners it in a
multi-node test, and how to schedule the groups of a split-search round.

A run is judged by combining the agent's own checks with the fleet
comparison. A first run that looks unhealthy is repeated before anything is
published, unless the agent already repeated it (an agent re-runs a level
whose checks failed before it reports). Only what the repeat confirms is the
verdict.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from services.bench.fleet import Evidence, Outcome, worse
from services.bench.split_search import Group
from services.bench.verdict import confirm


@dataclass(frozen=True)
class Decision:
    action: Literal["verdict", "retry"]
    outcome: Outcome
    reason: str


def decide(*, local: tuple[Outcome, str], fleet: tuple[Outcome, str],
           first: tuple[Outcome, str] | None, repeated: bool = True) -> Decision:
    """``local``: the agent's outcome (already repeated when failed);
    ``fleet``: the fleet-relative judgement; ``first``: the outcome of the run
    this one repeats, or None for a first run; ``repeated``: whether the
    repeat shows the same problem (a figure or the node score flagged both
    times) — a different symptom each time is noise, not a failing node."""
    current = worse(local[0], fleet[0])
    reasons = [why for outcome, why in (local, fleet) if outcome != "healthy"]
    reason = "; ".join(reasons) if reasons else fleet[1] or local[1]
    if first is not None:
        if current != "healthy" and local[0] == "healthy" and not repeated:
            return Decision("verdict", "healthy",
                            f"transient: first run {first[0]} ({first[1]}); the retry "
                            f"showed something else ({reason})")
        outcome, why = confirm(first, (current, reason))
        return Decision("verdict", outcome, why)
    if current == "healthy":
        return Decision("verdict", "healthy", reason)
    if local[0] == "failed":  # the agent saw it twice already
        return Decision("verdict", current, reason)
    return Decision("retry", current, reason)


def measure_again(evidence: Evidence, *, attempt: int, max_retries: int,
                  local: Outcome, fleet: Outcome) -> bool:
    """Whether a repeat (run number ``attempt``) that could not tell the node
    score either way (``weigh_retries``) earns one more run: only while
    repeats are left, and only when nothing else in the run (the agent's
    checks, a single figure) already says what is wrong."""
    return (evidence == "unsure" and attempt - 1 < max_retries
            and local == "healthy" and fleet == "healthy")


@dataclass(frozen=True)
class Candidate:
    node: str
    gpu_model: str
    outcome: Outcome | None  # the node's latest verdict; None: never judged
    judged_at: float  # when that verdict was given (0: never)
    alive: bool = True  # heard from recently


def choose_partner(node: str, gpu_model: str, candidates: Iterable[Candidate], *,
                   exclude: Iterable[str] = ()) -> str | None:
    """A known-healthy node of the same GPU model, most recently proven first
    (ties by name, so the choice is reproducible); None when there is none."""
    skip = {node, *exclude}
    healthy = [c for c in candidates if c.node not in skip and c.alive
               and c.outcome == "healthy" and c.gpu_model == gpu_model]
    if not healthy:
        return None
    return min(healthy, key=lambda c: (-c.judged_at, c.node)).node


def rendezvous_port(session: str, *, base: int, span: int) -> int:
    """A port for the session's TCP store, spread over [base, base+span)."""
    digest = hashlib.sha256(session.encode()).digest()
    return base + int.from_bytes(digest[:4], "big") % span


def waves(groups: Sequence[Group]) -> list[list[Group]]:
    """Split a round into waves whose groups share no node, in order: an agent
    takes part in one collective at a time, so groups that share a helper run
    one after the other."""
    out: list[tuple[set[str], list[Group]]] = []
    for group in groups:
        for used, wave in out:
            if not used & set(group.nodes):
                used.update(group.nodes)
                wave.append(group)
                break
        else:
            out.append((set(group.nodes), [group]))
    return [wave for _, wave in out]


def group_passed(reports: dict[str, tuple[bool, float | None]], nodes: Sequence[str], *,
                 reference_gbps: float | None, min_fraction: float) -> tuple[bool, str]:
    """A multi-node test passed when every node reported its share ok and the
    bandwidth is not far below the fleet's pair bandwidth.
    ``reports``: node -> (collective ok, busbw GB/s or None)."""
    missing = [n for n in nodes if n not in reports]
    if missing:
        return False, f"no result from {', '.join(missing)}"
    failed = [n for n in nodes if not reports[n][0]]
    if failed:
        return False, f"collective failed on {', '.join(failed)}"
    speeds = [bw for _, bw in reports.values() if bw is not None]
    if reference_gbps and speeds and min(speeds) < min_fraction * reference_gbps:
        return False, (f"bus bandwidth {min(speeds):.3g} GB/s < {min_fraction:.0%} of the "
                       f"fleet's {reference_gbps:.3g} GB/s")
    return True, "ok"
