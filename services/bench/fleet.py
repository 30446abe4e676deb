"""Fleet-relative judgement of bench figures (pure).

A node is compared with the other nodes of its own GPU model, not only with a
fixed floor: for each figure the fleet median and the median absolute
deviation (MAD, scaled to a standard deviation) are robust to the very
outliers we are looking for. A node is flagged when its figure is both more
than ``k`` robust deviations and more than ``min_drop`` (relative) below the
median — the second condition keeps a very uniform fleet from flagging noise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# 1.4826 turns a MAD into a standard deviation for normally distributed data.
MAD_TO_SIGMA = 1.4826


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


def compare_with_fleet(
    figures: list[NodeFigure], *, higher_is_better: set[str], k: float = 3.0,
    min_drop: float = 0.05, min_peers: int = 3,
) -> list[Deviation]:
    """Every figure named in ``higher_is_better`` against its model's fleet,
    sorted by how far below the median it is (worst first)."""
    groups: dict[tuple[str, str], list[NodeFigure]] = {}
    for f in figures:
        if f.name in higher_is_better:
            groups.setdefault((f.gpu_model, f.name), []).append(f)
    out = []
    for group in groups.values():
        values = [f.value for f in group]
        median = statistics.median(values)
        mad = statistics.median(abs(v - median) for v in values) * MAD_TO_SIGMA
        for f in group:
            relative = (f.value - median) / median if median else 0.0
            z = (f.value - median) / mad if mad else 0.0
            flagged = (len(group) >= min_peers and relative < -min_drop
                       and (mad == 0 or z < -k))
            out.append(Deviation(f.node, f.gpu_model, f.name, f.value, f.unit, median,
                                 relative, z, flagged, len(group)))
    return sorted(out, key=lambda d: (d.relative, d.node, d.name))
