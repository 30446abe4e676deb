"""Fleet-relative judgement of bench figures (pure).

A node is compared with the other nodes of its own GPU model, not only with a
fixed floor: for each figure the fleet median and the median absolute
deviation (MAD, scaled to a standard deviation) are robust to the very
outliers we are looking for. A figure is flagged when it is both more than
``k`` robust deviations and more than a relative drop below the median — the
second condition keeps a very uniform fleet from flagging noise.

``judge_node`` adds a node *score*: the geometric mean of the node's figures
as ratios of their fleet medians, each weighted by the inverse of its
variance across the fleet. A node that is uniformly slow (a throttled clock,
a power cap, a slow memory channel) moves every ratio a little; averaged over
several figures that shows well above the noise of any one figure. The score
is judged like a figure, against the scores of the peers. Absolute floors
per GPU model (from the configuration) catch a fleet that is slow as a whole.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from services.bench.config import FleetPolicy

# 1.4826 turns a MAD into a standard deviation for normally distributed data.
MAD_TO_SIGMA = 1.4826
# Figures judged against the fleet, by unit: more is better for all of them.
HIGHER_IS_BETTER_UNITS = frozenset({"TFLOPS", "GB/s", "tokens/s"})
Outcome = Literal["healthy", "degraded", "failed"]
SEVERITY: dict[Outcome, int] = {"healthy": 0, "degraded": 1, "failed": 2}


def judged(unit: str) -> bool:
    return unit in HIGHER_IS_BETTER_UNITS


@dataclass(frozen=True)
class NodeFigure:
    node: str
    gpu_model: str
    name: str
    value: float
    unit: str


@dataclass(frozen=True)
class Deviation:
    node: str
    gpu_model: str
    name: str
    value: float
    unit: str
    median: float
    relative: float  # (value - median) / median
    robust_z: float  # (value - median) / (MAD * 1.4826); 0 when MAD is 0
    flagged: bool
    peers: int


def robust_center(values: list[float]) -> tuple[float, float]:
    """Median and MAD scaled to a standard deviation."""
    median = statistics.median(values)
    return median, statistics.median(abs(v - median) for v in values) * MAD_TO_SIGMA


def compare_with_fleet(
    figures: list[NodeFigure], *, higher_is_better: set[str] | None = None, k: float = 3.0,
    min_drop: float = 0.05, min_peers: int = 3,
) -> list[Deviation]:
    """Every judged figure (named in ``higher_is_better``, or by unit when it is
    None) against its model's fleet, sorted by how far below the median it is
    (worst first). The fleet table of ``bench report``."""
    groups: dict[tuple[str, str], list[NodeFigure]] = {}
    for f in figures:
        if (f.name in higher_is_better) if higher_is_better is not None else judged(f.unit):
            groups.setdefault((f.gpu_model, f.name), []).append(f)
    out = []
    for group in groups.values():
        median, mad = robust_center([f.value for f in group])
        for f in group:
            relative = (f.value - median) / median if median else 0.0
            z = (f.value - median) / mad if mad else 0.0
            flagged = (len(group) >= min_peers and relative < -min_drop
                       and (mad == 0 or z < -k))
            out.append(Deviation(f.node, f.gpu_model, f.name, f.value, f.unit, median,
                                 relative, z, flagged, len(group)))
    return sorted(out, key=lambda d: (d.relative, d.node, d.name))


# --------------------------------------------------------------------------- one node


@dataclass(frozen=True)
class FigureVerdict:
    name: str
    value: float
    unit: str
    median: float | None  # None: too few peers to judge against
    relative: float
    robust_z: float
    peers: int
    outcome: Outcome
    why: str = ""


@dataclass(frozen=True)
class NodeJudgement:
    outcome: Outcome
    reason: str
    figures: list[FigureVerdict] = field(default_factory=list)
    score: float | None = None  # geometric mean of value / fleet median
    score_median: float | None = None  # of the peers' scores
    score_z: float = 0.0
    peers: int = 0
    score_flagged: bool = False

    @property
    def flagged(self) -> list[str]:
        """Names of what is wrong: figures, and ``node_score``."""
        names = [f.name for f in self.figures if f.outcome != "healthy"]
        return names + (["node_score"] if self.score_flagged else [])


def _weighted_score(values: Mapping[str, float], medians: Mapping[str, float],
                    weights: Mapping[str, float]) -> float | None:
    """exp(weighted mean of log(value / median)) over the figures present."""
    terms = [(weights[n], math.log(values[n] / m)) for n, m in medians.items()
             if n in values and m > 0 and values[n] > 0]
    total = sum(w for w, _ in terms)
    return math.exp(sum(w * x for w, x in terms) / total) if terms and total > 0 else None


@dataclass(frozen=True)
class Spread:
    """How much a fleet scatters, as robust relative deviations (MAD * 1.4826 /
    median): per figure and for the node score. Judging a retry against a few
    fresh peers takes the scale from the larger sweep before it, because the
    MAD of a few values is itself too noisy to trust."""

    figures: Mapping[str, float]
    score: float | None = None


def fleet_spread(runs: Mapping[str, Mapping[str, float]],
                 judged: Mapping[str, NodeJudgement] | None = None) -> Spread:
    """The spread of a set of runs (node -> figure -> value), and of the
    node scores of their judgements when given."""
    names = sorted({n for run in runs.values() for n in run})
    figures = {}
    for name in names:
        values = [run[name] for run in runs.values() if name in run]
        if len(values) >= 3:
            median, mad = robust_center(values)
            if median:
                figures[name] = mad / median
    ratios = [j.score / j.score_median for j in (judged or {}).values()
              if j.score is not None and j.score_median]
    score = robust_center(ratios)[1] if len(ratios) >= 3 else None
    return Spread(figures, score)


class SpreadHistory:
    """The scatter of every figure over a fleet's recent sweeps, per GPU model.

    One sweep's MAD of a figure over a handful of nodes is itself noisy, and
    the node score weighs each figure by the inverse square of its scatter: in
    a sweep where a noisy figure (collectives on a shared CPU) happens to
    scatter little, it takes most of the weight, and one lucky value of it
    can hide a node that every steady figure shows slow. How much a figure
    scatters is a property of the figure and the fleet, steady from sweep to
    sweep, so the scatter a sweep is judged with is, per figure, the larger of
    its own and the median over the last ``keep`` sweeps: a few nodes can
    show too little scatter by chance, and a sweep that really scatters more
    (a disturbed machine room) keeps its own. Kept in memory only: after a
    restart the first sweeps judge with their own scatter, as a fleet's first
    does."""

    def __init__(self, keep: int = 10) -> None:
        self.keep = keep
        self._spreads: dict[str, deque[Spread]] = {}

    def add(self, model: str, spread: Spread) -> None:
        self._spreads.setdefault(model, deque(maxlen=self.keep)).append(spread)

    def pooled(self, model: str, current: Spread | None = None) -> Spread:
        """Per figure, the larger of ``current``'s scatter and the median over
        the kept sweeps; the node score's scatter is ``current``'s (it changes
        with the figures' weights, so older ones do not compare)."""
        kept = self._spreads.get(model, ())
        own = current.figures if current else {}
        figures = dict(own)
        for name in sorted({name for spread in kept for name in spread.figures}):
            typical = statistics.median(s.figures[name] for s in kept if name in s.figures)
            figures[name] = max(typical, own.get(name, 0.0))
        return Spread(figures, current.score if current else None)

    def sweeps(self, model: str) -> int:
        return len(self._spreads.get(model, ()))


def judge_node(
    figures: Iterable[tuple[str, float, str]], peers: Mapping[str, Mapping[str, float]], *,
    policy: FleetPolicy, floors: Mapping[str, float] | None = None,
    spread: Spread | None = None,
) -> NodeJudgement:
    """One node's run (figure name, value, unit) against its peers' latest runs
    (peer node -> figure name -> value; same GPU model, the node itself left
    out) and the absolute floors of its GPU model. ``spread``: take the
    scatter from there instead of from the peers (see ``Spread``)."""
    floors = floors or {}
    mine = {name: (value, unit) for name, value, unit in figures}
    verdicts: list[FigureVerdict] = []
    medians: dict[str, float] = {}
    weights: dict[str, float] = {}
    for name, (value, unit) in sorted(mine.items()):
        if not judged(unit) and name not in floors:
            continue
        values = [p[name] for p in peers.values() if name in p]
        floor = floors.get(name)
        outcome: Outcome = "healthy"
        why = ""
        if floor is not None and not value >= floor:  # also catches NaN
            outcome, why = "failed", f"{value:.4g} {unit} below the floor {floor:.4g}"
        if not judged(unit) or len(values) < policy.min_peers:
            verdicts.append(FigureVerdict(name, value, unit, None, 0.0, 0.0, len(values),
                                          outcome, why))
            continue
        median, mad = robust_center(values)
        if spread is not None and name in spread.figures:
            mad = spread.figures[name] * median
        medians[name] = median
        # Inverse-variance weight of the figure in the node score, from the
        # fleet's own spread: a noisy figure (collectives on a shared CPU)
        # counts little, a steady one (GEMM on a GPU) much.
        scatter = max(mad / median if median else 1.0, policy.min_figure_spread)
        weights[name] = 1.0 / scatter**2
        relative = (value - median) / median if median else 0.0
        z = (value - median) / mad if mad else (0.0 if value == median else -math.inf
                                                 if value < median else math.inf)
        # Both a relative drop and a robust z: a figure the fleet itself
        # scatters widely (collectives on a shared CPU) needs a bigger drop.
        if outcome == "healthy" and z < -policy.k:
            if relative < -policy.fail_drop:
                outcome, why = "failed", f"{-relative:.0%} below the fleet median"
            elif relative < -policy.figure_drop:
                outcome, why = "degraded", f"{-relative:.0%} below the fleet median"
        verdicts.append(FigureVerdict(name, value, unit, median, relative, z, len(values),
                                      outcome, why))

    score = score_median = None
    score_z, score_flagged = 0.0, False
    own = _weighted_score({n: v for n, (v, _) in mine.items()}, medians, weights)
    peer_scores = [x for x in (_weighted_score(p, medians, weights) for p in peers.values())
                   if x is not None]
    if own is not None and len(peer_scores) >= policy.min_peers:
        score = own
        score_median, mad = robust_center(peer_scores)
        if spread is not None and spread.score is not None:
            mad = spread.score * score_median
        drop = score / score_median - 1
        score_z = (score - score_median) / mad if mad else 0.0
        score_flagged = drop < -policy.node_drop and (mad == 0 or score_z < -policy.node_k)

    worst = max((SEVERITY[v.outcome] for v in verdicts), default=0)
    outcome = ("healthy", "degraded", "failed")[max(worst, 1 if score_flagged else 0)]
    problems = [f"{v.name} {v.why}" for v in sorted(verdicts, key=lambda v: v.relative)
                if v.outcome != "healthy"]
    if score_flagged and score is not None and score_median is not None:
        problems.insert(0, f"node score {score / score_median - 1:+.1%} vs the fleet "
                           f"(robust z {score_z:.1f})")
    if problems:
        reason = "; ".join(problems[:4]) + (f" (+{len(problems) - 4} more)"
                                            if len(problems) > 4 else "")
    elif score is None:
        reason = f"too few peers to judge against ({len(peers)} < {policy.min_peers})"
    else:
        assert score_median is not None
        reason = f"within the fleet (node score {score / score_median - 1:+.1%})"
    return NodeJudgement(outcome, reason, verdicts, score, score_median, score_z, len(peers),
                         score_flagged)


def score_ratio(judged: NodeJudgement) -> float | None:
    """A node's score against the median score of its peers (1.0: typical)."""
    if judged.score is None or not judged.score_median:
        return None
    return judged.score / judged.score_median


Evidence = Literal["low", "normal", "unsure"]


def weigh_retries(last: NodeJudgement, earlier: Sequence[tuple[float, float]], *,
                  policy: FleetPolicy) -> tuple[Evidence, NodeJudgement]:
    """What the repeats of a suspect say about its node score: ``last`` (this
    repeat's judgement) with ``earlier`` repeats as (score ratio, robust z).

    The first run is left out on purpose: it made the node a suspect by
    being low, so its figure is biased low (a healthy node picked for one
    bad run would otherwise be judged on that run again). The repeats are
    unbiased: their geometric-mean ratio and combined robust z (Stouffer,
    (z1 + ... + zn) / sqrt n; in a sweep every repeat takes its scatter from
    the first pass, so the z share one scale) are "low" past ``node_drop`` and
    ``node_k`` — the node score is then flagged, over all repeats — and
    "normal" within ``retry_share`` of ``node_drop``. In between a repeat
    cannot tell a slow node from a noisy one, and says "unsure": measure
    once more (``max_retries``)."""
    ratio = score_ratio(last)
    if ratio is None or ratio <= 0 or any(r <= 0 for r, _ in earlier):
        return ("low" if last.score_flagged else "normal"), last
    ratios = [r for r, _ in earlier] + [ratio]
    pooled = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    z = (sum(z for _, z in earlier) + last.score_z) / math.sqrt(len(ratios))
    if pooled - 1 < -policy.node_drop and z < -policy.node_k:
        if last.score_flagged and not earlier:
            return "low", last
        why = (f"node score {pooled - 1:+.1%} vs the fleet over {len(ratios)} repeats "
               f"({', '.join(f'{r - 1:+.1%}' for r in ratios)}; robust z {z:.1f})")
        reason = why if last.outcome == "healthy" else f"{why}; {last.reason}"
        return "low", replace(last, outcome=worse(last.outcome, "degraded"), reason=reason,
                              score_flagged=True)
    if pooled - 1 > -policy.node_drop * policy.retry_share:
        return "normal", last
    return "unsure", last


def worse(a: Outcome, b: Outcome) -> Outcome:
    return a if SEVERITY[a] >= SEVERITY[b] else b


def milder(a: Outcome, b: Outcome) -> Outcome:
    return a if SEVERITY[a] <= SEVERITY[b] else b
