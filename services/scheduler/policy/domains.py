"""Choosing the racks a gang goes to: fewest racks, then fewest switches,
then preferred nodes, then the tightest fit.

Kept apart from node picking because the same choice serves two questions:
"where does this gang fit now" (score = free GPUs: least leftover wins) and
"where should a blocked gang wait for capacity" (score = minus free GPUs:
the racks that need the least draining win). Both go to the fewest network
domains first, since a collective across racks or switches is slower than
one inside a rack however tight the packing.
"""

from __future__ import annotations

from collections.abc import Sequence

from .topology import Cell


class RackCap:
    """What one rack offers a request: ``units`` that fit there, a ``score``
    to minimise over the chosen racks, and how many preferred nodes it has."""

    __slots__ = ("rack_id", "switch", "units", "score", "pref", "cells")

    def __init__(self, rack_id: int, switch: str, units: int, score: int, pref: int,
                 cells: list[Cell]) -> None:
        self.rack_id = rack_id
        self.switch = switch
        self.units = units
        self.score = score
        self.pref = pref
        self.cells = cells


Choice = list[tuple[RackCap, int]]
"""Racks chosen, with how many units each takes."""
ChoiceKey = tuple[int, int, int, int]


def choose_racks(racks: Sequence[RackCap], need: int) -> tuple[ChoiceKey, Choice] | None:
    """The best set of racks holding ``need`` units, and its ranking key
    (racks, switches, -preferred nodes, score) so callers can compare
    choices across GPU models. None if the racks together are too small."""
    if need <= 0:
        return None
    total = 0
    single: RackCap | None = None
    single_key: tuple[int, int, int] | None = None
    for r in racks:
        total += r.units
        if r.units >= need:
            key = (-r.pref, r.score, r.rack_id)
            if single_key is None or key < single_key:
                single, single_key = r, key
    if single is not None:
        return (1, 1, -single.pref, single.score), [(single, need)]
    if total < need:
        return None
    best: tuple[ChoiceKey, Choice] | None = None
    by_switch: dict[str, list[RackCap]] = {}
    units: dict[str, int] = {}
    for r in racks:
        by_switch.setdefault(r.switch, []).append(r)
        units[r.switch] = units.get(r.switch, 0) + r.units
    groups = [g for s, g in by_switch.items() if units[s] >= need] if len(by_switch) > 1 else []
    for group in [*groups, list(racks)]:  # a switch too small for the gang is not sorted
        picked = _fewest(group, need)
        if picked is None:
            continue
        key: ChoiceKey = (len(picked), len({r.switch for r, _ in picked}),
                          -sum(r.pref for r, _ in picked), sum(r.score for r, _ in picked))
        if best is None or key < best[0]:
            best = (key, picked)
    return best


def _fewest(group: Sequence[RackCap], need: int) -> Choice | None:
    """Largest racks first until the rest fits in one more rack; that last
    rack is the tightest one that holds the remainder."""
    ordered = sorted(group, key=lambda r: (-r.units, -r.pref, r.score, r.rack_id))
    acc = 0
    k = 0
    for k, r in enumerate(ordered):  # noqa: B007 - k is used after the loop
        if acc + r.units >= need:
            break
        acc += r.units
    else:
        return None
    remainder = need - acc
    head = ordered[:k]
    last = min((r for r in ordered[k:] if r.units >= remainder),
               key=lambda r: (-r.pref, r.score, r.rack_id))
    return [(r, r.units) for r in head] + [(last, remainder)]
