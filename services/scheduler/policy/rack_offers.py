"""What the racks of one GPU model offer one request shape, kept for the
placement cycle: per rack its free slots and a ``RackCap``, and the rack
choice per size, brought up to date rack by rack as the counters change.

``placement`` asks these instead of counting every rack of every model for
each question; on clusters of thousands of racks that pass was most of a
decision's cost.
"""

from __future__ import annotations

from .domains import Chosen, RackCap, choose_from_switches, choose_racks
from .request import Request
from .state import ClusterState
from .topology import Cell, ModelCounts


class RackOffer:
    """What the racks of one GPU model offer one request shape (slot size,
    rack unit, pools, one slot or more): per rack, in topology order, its
    free slots and, when it has room for a unit, a ``RackCap``; the units in
    all; and the rack choice per size, memoised.

    Offers without preferred nodes are kept for the cycle in
    ``state.rack_caps``. When the model's counters change (a placement, a
    hold, an undo), ``refresh`` looks again only at the racks named in the
    model's change log since: a gang's search then costs the racks that
    changed plus the rack choice, not a pass over every rack of every model
    (milliseconds a decision with thousands of racks).

    The rack choice is kept per switch too: a change recounts its rack and
    forgets only that switch's choices, and ``choose`` combines the
    switches' own answers (``domains.choose_from_switches``), so a gang's
    search after a placement costs the switches, not a sort of every rack."""

    __slots__ = ("racks", "sg", "ru", "pools", "single", "pref", "slots", "caps",
                 "units", "unit_counts", "switch_of", "switches", "switch_chosen",
                 "seen", "_caps", "chosen")

    def __init__(self, state: ClusterState, model: str, req: Request,
                 pref_racks: dict[int, int]) -> None:
        self.racks = state.model_racks[model]
        self.sg, self.ru, self.pools = req.slot_gpus, req.rack_unit, req.pools
        self.single = req.slots == 1
        self.pref = pref_racks
        self.slots = [0] * len(self.racks)
        self.caps: list[RackCap | None] = [None] * len(self.racks)
        self.units = 0
        self.unit_counts: dict[int, int] = {}
        """How many racks offer each number of units (for the fewest racks)."""
        self.switch_of: list[int] = []
        self.switches: list[tuple[int, int]] = []
        """Per switch, in topology order: its racks' positions, start and end
        (nodes are sorted by switch first, so a switch's racks are adjacent)."""
        for k, (rack_id, _) in enumerate(self.racks):
            if k == 0 or state.rack_switch[rack_id] != state.rack_switch[self.racks[k - 1][0]]:
                self.switches.append((k, k + 1))
            else:
                self.switches[-1] = (self.switches[-1][0], k + 1)
            self.switch_of.append(len(self.switches) - 1)
        self.switch_chosen: list[dict[int, Chosen]] = [{} for _ in self.switches]
        counts = state.model_counts.get(model)
        self.seen = len(counts.changed) if counts is not None else 0
        self._caps: list[RackCap] | None = None
        self.chosen: dict[int, Chosen] = {}
        for k in range(len(self.racks)):
            self._look(state, k)

    def _look(self, state: ClusterState, k: int) -> None:
        """(Re)count rack ``k`` of the model."""
        rack_id, cells = self.racks[k]
        sg, pools = self.sg, self.pools
        if pools is not None:
            cells = [c for c in cells if c.pool in pools]
        if len(cells) == 1:
            cell = cells[0]
            score = cell.free
            slots = cell.slots(sg) if score >= sg else 0
        else:
            slots = sum(c.slots(sg) for c in cells)
            score = sum(c.free for c in cells)
        old = self.caps[k]
        if old is not None:
            self.units -= old.units
            self.unit_counts[old.units] -= 1
        self.slots[k] = slots
        units = slots // self.ru
        if units:
            if self.single:
                score |= _best_fit(cells, sg) << 32
            self.caps[k] = RackCap(rack_id, state.rack_switch[rack_id], units, score,
                                   self.pref.get(rack_id, 0), cells)
            self.units += units
            self.unit_counts[units] = self.unit_counts.get(units, 0) + 1
        else:
            self.caps[k] = None

    def refresh(self, state: ClusterState, counts: ModelCounts) -> None:
        """Recount the racks changed since this offer last looked."""
        changed = counts.changed
        if self.seen == len(changed):
            return
        racks = set(changed[self.seen:])
        self.seen = len(changed)
        index = counts.rack_index
        for rack_id in racks:
            k = index[rack_id]
            self._look(state, k)
            self.switch_chosen[self.switch_of[k]].clear()
        self._caps = None
        self.chosen.clear()

    def choose(self, need: int) -> Chosen:
        if need not in self.chosen:
            self.chosen[need] = (None if self.units < need else
                                 choose_from_switches(self._switch_choices(need), need,
                                                      self.unit_counts, self._all_caps))
        return self.chosen[need]

    def _switch_choices(self, need: int) -> list[Chosen]:
        out = []
        for s, (lo, hi) in enumerate(self.switches):
            memo = self.switch_chosen[s]
            if need not in memo:
                memo[need] = choose_racks([c for c in self.caps[lo:hi] if c is not None], need)
            out.append(memo[need])
        return out

    def _all_caps(self) -> list[RackCap]:
        if self._caps is None:
            self._caps = [c for c in self.caps if c is not None]
        return self._caps

    def top(self) -> tuple[int, int]:
        """(slots, rack id) of the rack with the most slots, first in
        topology order; (0, -1) when none has any."""
        best, rack = 0, -1
        for k, slots in enumerate(self.slots):
            if slots > best:
                best, rack = slots, self.racks[k][0]
        return best, rack


def rack_offer(state: ClusterState, model: str, req: Request,
               pref_racks: dict[int, int]) -> RackOffer:
    """The model's offer for ``req``'s shape: the one kept for the cycle,
    brought up to date, or a new one (kept unless nodes are preferred)."""
    counts = state.model_counts.get(model)
    if pref_racks or counts is None:
        return RackOffer(state, model, req, pref_racks)
    key = (model, req.slot_gpus, req.rack_unit, req.pools, req.slots == 1)
    offer = state.rack_caps.get(key)
    if offer is None:
        offer = state.rack_caps[key] = RackOffer(state, model, req, pref_racks)
    else:
        offer.refresh(state, counts)
    return offer


def _best_fit(cells: list[Cell], slot_gpus: int) -> int:
    """Rank of the tightest node for one slot: its ``Cell.node_class``
    (smallest free count first, and at equal free a partly used node
    before an empty one: taking an empty node strands its remainder,
    topping up a used one does not)."""
    best = 1 << 30
    for cell in cells:
        hist = cell.hist
        for f in range(slot_gpus, len(hist)):
            if hist[f]:
                best = min(best, cell.node_class(f))
                break
    return best
