"""How nodes are ordered and grouped into network domains.

Primus-SaFE's ``topologyIPSort`` groups nodes by their rack label and orders
them by numeric IP inside a rack, so that neighbouring ranks of a gang land
on neighbouring machines. We do the same, with one more level: racks are
grouped under a switch label, so a gang that must span racks prefers racks
behind one switch. A *cell* is the finest group the placement engine keeps
counters for: the ready nodes of one GPU model and one pool in one rack.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from functools import lru_cache

from .model import Node


@lru_cache(maxsize=1 << 17)
def ip_key(ip: str) -> tuple[int, int]:
    """Numeric IPv4 order (10.0.0.9 < 10.0.0.10); unparsable addresses last."""
    parts = ip.split(".")
    if len(parts) == 4:
        try:
            a, b, c, d = (int(p) for p in parts)
        except ValueError:
            return (1, 0)
        if all(0 <= x <= 255 for x in (a, b, c, d)):
            return (0, (a << 24) | (b << 16) | (c << 8) | d)
    return (1, 0)


def topo_key(node: Node) -> tuple[str, str, tuple[int, int], str]:
    """Switch, then rack, then IP, then name: ties always break the same way."""
    return (node.switch, node.rack, ip_key(node.ip), node.name)


def rack_label(rack: str) -> str:
    return rack or "(unlabelled)"


class ModelCounts:
    """What the cells of one GPU model keep together: their usable nodes
    counted by ``Cell.node_class``, in all and per rack; the free GPUs of
    the model in each rack, and the racks by that number (``by_free[v]``:
    the racks with exactly ``v`` free, in topology order), so the fullest
    rack with some kind of node is found without visiting the emptier
    ones; and ``changed``, the rack of every change to their counters, so
    an answer computed over the model's racks is brought up to date by
    looking again at the racks changed since, not at all of them."""

    __slots__ = ("classes", "class_racks", "changed", "rack_free", "by_free", "rack_cells",
                 "rack_index")

    def __init__(self, max_gpus: int, racks: list[tuple[int, list[Cell]]]) -> None:
        self.classes = [0] * (2 * max_gpus + 2)
        self.class_racks: list[dict[int, int]] = [{} for _ in self.classes]
        """Per node class, the racks that have such nodes: rack id -> how many."""
        self.changed: list[int] = []
        self.rack_cells = dict(racks)
        self.rack_index = {r: k for k, (r, _) in enumerate(racks)}
        self.rack_free = {r: sum(c.free for c in cells) for r, cells in racks}
        most = max((sum(c.capacity_slots(1) for c in cells) for _, cells in racks), default=0)
        self.by_free: list[list[int]] = [[] for _ in range(most + 1)]
        for r, free in self.rack_free.items():  # racks come in topology order
            self.by_free[free].append(r)
        for r, cells in racks:
            for cell in cells:
                for f, n in enumerate(cell.hist):
                    if n:
                        self.tally(r, cell.node_class(f), n)

    def room(self, gpus: int) -> tuple[bool, bool]:
        """Whether some counted node has ``gpus`` free or more: one already
        in use, and one wholly free (see ``Cell.node_class``)."""
        on_used = on_empty = False
        for c in range(2 * gpus, len(self.classes)):
            if self.classes[c]:
                if c & 1:
                    on_empty = True
                else:
                    on_used = True
        return on_used, on_empty

    def tally(self, rack_id: int, node_class: int, delta: int) -> None:
        """``delta`` more nodes of ``node_class`` in the rack."""
        self.classes[node_class] += delta
        racks = self.class_racks[node_class]
        n = racks.get(rack_id, 0) + delta
        if n:
            racks[rack_id] = n
        else:
            del racks[rack_id]

    def shift(self, rack_id: int, delta: int) -> None:
        """The rack's free GPUs of the model changed by ``delta``."""
        old = self.rack_free[rack_id]
        self.rack_free[rack_id] = old + delta
        bucket = self.by_free[old]
        del bucket[_find(bucket, rack_id)]
        insort(self.by_free[old + delta], rack_id)


class Cell:
    """Counters for the ready nodes of one (switch, rack, model, pool, node
    size).

    ``hist[f]`` is how many usable nodes have exactly ``f`` free GPUs;
    ``buckets[f]`` lists those nodes (by topology index, ascending);
    ``nodes`` counts them (each has ``top`` GPUs). All three are kept up to
    date on every allocation, so a placement question costs a
    pass over a few counters per rack instead of a pass over every node.
    ``counts`` is what the cells of one GPU model keep together
    (``ModelCounts``), updated by the same calls.
    """

    __slots__ = ("index", "switch", "rack", "rack_id", "model", "pool",
                 "hist", "buckets", "nodes", "free", "counts")

    def __init__(self, index: int, switch: str, rack: str, rack_id: int,
                 model: str, pool: str, gpus: int) -> None:
        self.index = index
        self.switch = switch
        self.rack = rack
        self.rack_id = rack_id
        self.model = model
        self.pool = pool
        self.hist = [0] * (gpus + 1)
        self.buckets: list[list[int]] = [[] for _ in range(gpus + 1)]
        self.nodes = 0
        self.free = 0
        self.counts: ModelCounts | None = None

    @property
    def top(self) -> int:
        """The GPUs of each node of this cell."""
        return len(self.hist) - 1

    def node_class(self, free: int) -> int:
        """``2 * free``, plus 1 when the node is wholly free (all of a
        cell's nodes have ``top`` GPUs): tighter nodes sort first, and at
        equal free GPUs a partly used node before an empty one."""
        return 2 * free + (free == len(self.hist) - 1)

    def add(self, node: int, free: int) -> None:
        self.hist[free] += 1
        insort(self.buckets[free], node)
        self.nodes += 1
        self.free += free
        counts = self.counts
        if counts is not None:
            counts.tally(self.rack_id, self.node_class(free), 1)
            counts.changed.append(self.rack_id)
            if free:
                counts.shift(self.rack_id, free)

    def append(self, node: int, free: int) -> None:
        """``add`` for a node with a higher index than any already here."""
        self.hist[free] += 1
        self.buckets[free].append(node)
        self.nodes += 1
        self.free += free

    def remove(self, node: int, free: int) -> None:
        self.hist[free] -= 1
        bucket = self.buckets[free]
        del bucket[_find(bucket, node)]
        self.nodes -= 1
        self.free -= free
        counts = self.counts
        if counts is not None:
            counts.tally(self.rack_id, self.node_class(free), -1)
            counts.changed.append(self.rack_id)
            if free:
                counts.shift(self.rack_id, -free)

    def move(self, node: int, old: int, new: int) -> None:
        self.hist[old] -= 1
        self.hist[new] += 1
        bucket = self.buckets[old]
        del bucket[_find(bucket, node)]
        insort(self.buckets[new], node)
        self.free += new - old
        counts = self.counts
        if counts is not None:
            counts.tally(self.rack_id, self.node_class(old), -1)
            counts.tally(self.rack_id, self.node_class(new), 1)
            counts.changed.append(self.rack_id)
            counts.shift(self.rack_id, new - old)

    def slots(self, slot_gpus: int) -> int:
        """How many slots of ``slot_gpus`` the free GPUs of this cell hold."""
        if slot_gpus == 1:
            return self.free
        hist = self.hist
        total = 0
        for f in range(slot_gpus, len(hist)):
            count = hist[f]
            if count:
                total += count * (f // slot_gpus)
        return total

    def capacity_slots(self, slot_gpus: int) -> int:
        """Slots the cell would hold if every job on it ended."""
        return self.nodes * (self.top // slot_gpus)


def _find(bucket: list[int], node: int) -> int:
    i = bisect_left(bucket, node)
    if i == len(bucket) or bucket[i] != node:
        raise KeyError(node)
    return i
