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

import heapq
from collections.abc import Callable, Mapping, Sequence

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
Chosen = tuple[ChoiceKey, Choice] | None


def choose_racks(racks: Sequence[RackCap], need: int) -> Chosen:
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
    # Greedy largest-first finds the fewest racks of any set, so no switch
    # can do with fewer than the whole list, and one that matches it wins
    # the switch count: only those switches are searched, and the whole
    # list only when none matches (its answer then spans switches).
    fewest = _fewest_count([r.units for r in racks], need)
    by_switch: dict[str, list[RackCap]] = {}
    for r in racks:
        by_switch.setdefault(r.switch, []).append(r)
    best: Chosen = None
    if len(by_switch) > 1:
        for group in by_switch.values():
            if _fewest_count([r.units for r in group], need) == fewest:
                best = _better(best, _fewest(group, need, fewest))
    if best is None:
        best = _better(None, _fewest(racks, need, fewest))
    return best


def choose_from_switches(per_switch: Sequence[Chosen], need: int, unit_counts: Mapping[int, int],
                         racks: Callable[[], Sequence[RackCap]]) -> Chosen:
    """``choose_racks`` over all racks, from each switch's own answer
    (switches in topology order; ``unit_counts``: how many racks offer each
    number of units; ``racks``: all of them, asked for only when the gang
    must span switches). A caller that keeps the switches' answers across
    changes then pays per switch, not per rack."""
    single: Chosen = None
    for chosen in per_switch:  # the best single rack is the best of each switch's
        if chosen is not None and chosen[0][0] == 1 and (
                single is None or (chosen[0], chosen[1][0][0].rack_id)
                < (single[0], single[1][0][0].rack_id)):
            single = chosen
    if single is not None:
        return single
    units = [u for u, n in unit_counts.items() for _ in range(min(n, need))]
    fewest = _fewest_count(units, need)
    if not fewest:
        return None
    best: Chosen = None
    for chosen in per_switch:  # no single rack anywhere: each answer is its fewest
        if chosen is not None and chosen[0][0] == fewest and (best is None or chosen[0] < best[0]):
            best = chosen
    return best if best is not None else _better(None, _fewest(racks(), need, fewest))


def _fewest_count(units: list[int], need: int) -> int:
    """How many racks, largest first, hold ``need`` units (0: they cannot).
    Sorts ``units``, a list the caller made for this."""
    units.sort(reverse=True)
    acc = 0
    for k, u in enumerate(units, 1):
        acc += u
        if acc >= need:
            return k
    return 0


def _fewest(group: Sequence[RackCap], need: int, count: int) -> Choice:
    """``count`` racks: the largest first until the rest fits in one more
    rack (``count`` is how many that takes); that last rack is the
    tightest one that holds the remainder."""
    head = heapq.nsmallest(count - 1, group, key=lambda r: (-r.units, -r.pref, r.score, r.rack_id))
    remainder = need - sum(r.units for r in head)
    taken = {r.rack_id for r in head}
    last = min((r for r in group if r.units >= remainder and r.rack_id not in taken),
               key=lambda r: (-r.pref, r.score, r.rack_id))
    return [(r, r.units) for r in head] + [(last, remainder)]


def _better(best: Chosen, picked: Choice) -> tuple[ChoiceKey, Choice]:
    """``picked`` with its ranking key, if it ranks before ``best``."""
    key: ChoiceKey = (len(picked), len({r.switch for r, _ in picked}),
                      -sum(r.pref for r, _ in picked), sum(r.score for r, _ in picked))
    return (key, picked) if best is None or key < best[0] else best
