"""Where a gang fits right now: racks, then nodes, then ranks. Pure reads.

``find_placement`` never changes the state (excluded nodes are hidden in a
plan that is discarded before it returns); the caller decides whether to
commit the answer. Per rack it reads the cell counters only, so a question
costs O(racks x free-GPU values) plus O(nodes chosen), not O(nodes).

Within a rack the gang takes the nodes with the most free slots first until
the rest fits on one node, which is then the tightest such node: fewest
nodes, least leftover, and single-worker jobs land on the fullest node that
holds them (best fit), keeping large free blocks for large gangs. Ranks are
numbered in topology order (rack, then IP), so a parallelism unit's ranks
are neighbours and a rack-scoped unit never straddles racks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .domains import RackCap
from .fragmentation import FragTable
from .rack_offers import RackOffer, rack_offer
from .request import Request
from .state import ClusterState
from .topology import Cell


@dataclass(frozen=True, slots=True)
class Found:
    model: str
    ranks: tuple[tuple[int, int], ...]
    """(node index, GPUs) per worker rank."""
    per_node: dict[int, int]
    racks: int


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a request does not fit now, in numbers the explanation uses."""

    free_gpus: int
    """Free GPUs on the nodes the request may use."""
    fit_units: int
    """Units (rack-scoped) or slots the free GPUs hold, summed over racks."""
    best_rack_gpus: int
    """Usable free GPUs (whole slots) in the rack holding the most."""
    best_rack: int
    """Id of that rack, -1 if none."""
    most_on_a_node: int = 0
    """Most free GPUs on any one usable node (filled in by ``measure``)."""


def find_placement(state: ClusterState, req: Request) -> Found | Shortfall:
    if state.degraded:
        # Degraded nodes last: a gang goes there only if healthy ones cannot hold it.
        with state.what_if():
            for i in (*req.exclude, *state.degraded):
                state.mask(i)
            found = _find(state, req)
        if isinstance(found, Found):
            return found
    if req.exclude:
        with state.what_if():
            for i in req.exclude:
                state.mask(i)
            return _find(state, req)
    return _find(state, req)


def measure(state: ClusterState, req: Request) -> Shortfall:
    """The numbers behind a "does not fit" answer, for explanations."""
    if req.exclude:
        with state.what_if():
            for i in req.exclude:
                state.mask(i)
            found = _find(state, req, choose=False)
    else:
        found = _find(state, req, choose=False)
    assert isinstance(found, Shortfall)
    return found


def _find(state: ClusterState, req: Request, *, choose: bool = True) -> Found | Shortfall:
    best: tuple[tuple[float, ...], str, list[tuple[RackCap, int]]] | None = None
    frag = state.frag if choose else None
    free_gpus = fit_units = most = 0
    need = req.units
    sg, ru, pools = req.slot_gpus, req.rack_unit, req.pools
    single = req.slots == 1  # one node: the tightest node matters more than the tightest rack
    if single and choose and state.frag is not None and not req.prefer:
        return _find_one_node(state, req, state.frag)
    pref_racks = _preferred_racks(state, req)
    offers: list[RackOffer] = []
    for model in req.models:
        model_free = state.model_free.get(model, 0)
        free_gpus += model_free
        if choose and (pools is None and model_free < req.need
                       or _slots_at_most(state, model, sg) // ru < need):
            continue  # too few free GPUs, or too few free in whole slots
        offer = rack_offer(state, model, req, pref_racks)
        offers.append(offer)
        fit_units = max(fit_units, offer.units)
        if not choose:
            most = max(most, _most_on_a_node(state, model, pools))
            continue
        if offer.units < need:
            continue
        chosen = offer.choose(need)
        if chosen is None:
            continue
        # Across GPU models: fewest racks, switches and most preferred nodes
        # first, then the least pulled model, then the tightest fit.
        racks, switches, pref, score = chosen[0]
        key = (racks, switches, pref, frag.pull(model, model_free) if frag else 0.0, score)
        if best is None or key < best[0]:
            best = (key, model, chosen[1])
    if best is None:
        if pools is not None:
            free_gpus = state.free_gpus(req.models, pools)
        best_rack_slots, best_rack = 0, -1
        for offer in offers:  # the rack with the most slots, first in topology order
            slots, rack = offer.top()
            if slots > best_rack_slots:
                best_rack_slots, best_rack = slots, rack
        return Shortfall(free_gpus, fit_units, best_rack_slots * sg, best_rack, most)
    _, model, choice = best
    return _materialise(state, req, model, choice)


def _find_one_node(state: ClusterState, req: Request, table: FragTable) -> Found | Shortfall:
    """A single slot: the least pulled GPU model, then the node whose
    fragmentation for the expected mix grows least; ties go to the tightest
    node (a partly used one before an empty one), then the fullest rack,
    then topology order.

    The first three depend only on the model and the node's class (its free
    GPUs, and whether it is empty), and the per-model class counters say
    which classes exist: those are ranked first, and only the best one's
    racks are visited. Ranking every free count of every cell instead made
    a decision cost milliseconds on a cluster of many racks of small nodes
    (``bench/scheduler_scale.py``'s heterogeneous scenarios)."""
    sg, pools = req.slot_gpus, req.pools
    ranked: list[tuple[float, float, int, str]] = []
    for model in req.models:
        if state.model_free.get(model, 0) < sg:
            continue
        pull = table.pull(model, state.model_free[model])
        classes = state.model_counts[model].classes
        for c in range(2 * sg, len(classes)):
            if classes[c]:
                ranked.append((pull, table.delta(model, c >> 1, sg), c, model))
    ranked.sort()
    start = 0
    while start < len(ranked):
        key = ranked[start][:3]
        end = start
        best: tuple[int, int] | None = None
        best_model = ""
        while end < len(ranked) and ranked[end][:3] == key:
            c, model = ranked[end][2], ranked[end][3]
            end += 1
            found = _fullest_rack_with(state, model, c, pools)
            if found is not None and (best is None or found < best):
                best, best_model = found, model
        if best is not None:
            return _found(req, best_model, {best[1]: 1}, 1)
        start = end  # that class is only in pools the job may not use
    # No usable node has room for the slot (``measure`` has the details).
    return Shortfall(state.free_gpus(req.models, pools), 0, 0, -1)


SCAN_PER_RACK_OF_CLASS = 1
"""How many racks a one-node search visits, fullest first, per rack that
has a node of the wanted class, before it compares those racks instead.
Both ways give the same answer; visiting costs the fuller racks without
such a node, comparing costs every rack with one. Bounding the first by
the second keeps a search in thousands of racks to the cheaper of the
two (a rare class, such as the last partly used node of its kind, is in a
few racks among thousands of fuller ones)."""


def _fullest_rack_with(state: ClusterState, model: str, node_class: int,
                       pools: frozenset[str] | None) -> tuple[int, int] | None:
    """(free GPUs of ``model`` in the rack, node) of the lowest node of
    ``node_class`` in the rack with the fewest free GPUs of the model; None
    if no usable cell has such a node. Without a pool filter the racks are
    visited fullest first and the first that has one ends the search (see
    ``SCAN_PER_RACK_OF_CLASS``)."""
    f = node_class >> 1
    empty = node_class & 1
    if pools is None:
        counts = state.model_counts[model]
        rack_cells, rack_free = counts.rack_cells, counts.rack_free
        having = counts.class_racks[node_class]
        if not having:
            return None
        budget = SCAN_PER_RACK_OF_CLASS * len(having)
        # The racks by free GPUs, fullest first, each in topology order.
        for free in range(f, len(counts.by_free)):
            for rack_id in counts.by_free[free]:
                if rack_id in having:  # a later rack's nodes come later in topology order
                    return free, _lowest_of_class(rack_cells[rack_id], f, empty)
                budget -= 1
                if budget < 0:  # cheaper now to compare the racks that have one
                    rack_id = min(having, key=lambda r: (rack_free[r], r))  # ids: topology order
                    return rack_free[rack_id], _lowest_of_class(rack_cells[rack_id], f, empty)
        return None
    best: tuple[int, int] | None = None
    for _, cells in state.model_racks[model]:
        cells = [c for c in cells if c.pool in pools]
        node = _lowest_of_class(cells, f, empty)
        if node >= 0:
            key = (sum(c.free for c in cells), node)
            if best is None or key < best:
                best = key
    return best


def _lowest_of_class(cells: list[Cell], f: int, empty: int) -> int:
    """The lowest node of ``cells`` with ``f`` free GPUs that is (``empty``)
    or is not wholly free; -1 if none."""
    node = -1
    for cell in cells:
        hist = cell.hist
        if f < len(hist) and hist[f] and (f == len(hist) - 1) == empty:
            first = cell.buckets[f][0]
            if node < 0 or first < node:
                node = first
    return node


def place_on(state: ClusterState, req: Request, nodes: Iterable[int]) -> Found | None:
    """``req`` on ``nodes`` only (e.g. the nodes drained for it), in topology
    order, or None when they cannot hold it now. Costs O(len(nodes))."""
    sg, ru = req.slot_gpus, req.rack_unit
    skip = set(req.exclude)
    by_model: dict[str, list[tuple[int, int, int]]] = {}
    for i in sorted(set(nodes)):
        cell = state.cell_of[i]
        if cell is None or state.masked[i] or i in skip or cell.model not in req.models \
                or (req.pools is not None and cell.pool not in req.pools):
            continue
        slots = state.eff_free(i) // sg
        if slots:
            by_model.setdefault(cell.model, []).append((i, slots, cell.rack_id))
    for model in req.models:
        candidates = by_model.get(model, [])
        per_rack: dict[int, int] = {}
        for _, slots, rack in candidates:
            per_rack[rack] = per_rack.get(rack, 0) + slots
        if sum(v // ru for v in per_rack.values()) < req.units:
            continue
        taken: dict[int, int] = {}
        left = req.units
        for rack, slots in per_rack.items():  # racks in topology order
            want = min(slots // ru, left) * ru
            left -= want // ru
            for i, free, r in candidates:
                if r == rack and want:
                    k = min(free, want)
                    taken[i] = k
                    want -= k
            if not left:
                break
        return _found(req, model, taken, len({r for i, _, r in candidates if i in taken}))
    return None


def _slots_at_most(state: ClusterState, model: str, slot_gpus: int) -> int:
    """Slots of ``slot_gpus`` the free GPUs of ``model`` hold, over every
    pool: no choice of racks can find more."""
    counts = state.model_counts.get(model)
    return 0 if counts is None else sum(n * ((c >> 1) // slot_gpus)
                                        for c, n in enumerate(counts.classes) if n)


def _most_on_a_node(state: ClusterState, model: str, pools: frozenset[str] | None) -> int:
    """Most free GPUs on any usable node of ``model`` (in ``pools``)."""
    if pools is None:
        classes = state.model_counts[model].classes
        return next((c >> 1 for c in range(len(classes) - 1, 1, -1) if classes[c]), 0)
    return max((_most_free(c) for _, cells in state.model_racks[model] for c in cells
                if c.pool in pools), default=0)


def _most_free(cell: Cell) -> int:
    hist = cell.hist
    for f in range(len(hist) - 1, 0, -1):
        if hist[f]:
            return f
    return 0


def _preferred_racks(state: ClusterState, req: Request) -> dict[int, int]:
    counts: dict[int, int] = {}
    for i in req.prefer:
        cell = state.cell_of[i]
        if cell is not None and not state.masked[i] and state.eff_free(i) >= req.slot_gpus:
            counts[cell.rack_id] = counts.get(cell.rack_id, 0) + 1
    return counts


def _materialise(state: ClusterState, req: Request, model: str,
                 choice: list[tuple[RackCap, int]]) -> Found:
    taken: dict[int, int] = {}
    for rack, units in choice:
        pick_nodes(state, req, rack.cells, units * req.rack_unit, taken)
    return _found(req, model, taken, len(choice))


def _found(req: Request, model: str, taken: dict[int, int], racks: int) -> Found:
    """The answer for ``taken`` (node index -> slots): ranks in node order,
    each slot's workers next to each other."""
    ranks: list[tuple[int, int]] = []
    g = req.job.gpus_per_worker
    per_slot = req.workers_per_slot
    for i in sorted(taken):
        ranks.extend([(i, g)] * (taken[i] * per_slot))
    per_node = {i: k * req.slot_gpus for i, k in taken.items()}
    return Found(model, tuple(ranks), per_node, racks)


def pick_nodes(state: ClusterState, req: Request, cells: list[Cell], slots: int,
               taken: dict[int, int]) -> None:
    """Choose nodes in ``cells`` for ``slots`` slots; adds node -> slots to
    ``taken``. The caller has checked that the cells hold that many."""
    sg = req.slot_gpus
    remaining = slots
    if req.prefer:
        for i in sorted(req.prefer):
            if remaining == 0:
                break
            if state.cell_of[i] in cells and not state.masked[i] and i not in taken:
                k = min(state.eff_free(i) // sg, remaining)
                if k > 0:
                    taken[i] = k
                    remaining -= k
    top = max(len(c.hist) for c in cells) - 1
    cursors: dict[tuple[int, int], int] = {}
    while remaining > 0:
        node = -1
        start = sg * remaining
        if start <= top:
            for f in range(start, top + 1):
                node = _head(cells, f, cursors, taken)
                if node >= 0:
                    break
        if node >= 0:
            taken[node] = remaining
            return
        for f in range(top, sg - 1, -1):
            node = _head(cells, f, cursors, taken)
            if node >= 0:
                k = min(f // sg, remaining)
                taken[node] = k
                remaining -= k
                break
        else:
            raise AssertionError("counters promised more slots than the nodes hold")


def _head(cells: list[Cell], f: int, cursors: dict[tuple[int, int], int],
          taken: dict[int, int]) -> int:
    """Lowest-index node with exactly ``f`` free GPUs not yet taken, or -1."""
    best = -1
    for cell in cells:
        if f >= len(cell.hist) or not cell.hist[f]:
            continue
        bucket = cell.buckets[f]
        key = (cell.index, f)
        pos = cursors.get(key, 0)
        while pos < len(bucket) and bucket[pos] in taken:
            pos += 1
        cursors[key] = pos
        if pos < len(bucket) and (best < 0 or bucket[pos] < best):
            best = bucket[pos]
    return best
