"""How much a placement fragments the cluster for the jobs expected next.

In the spirit of Fragmentation Gradient Descent ("Beware of Fragmentation",
USENIX ATC'23, whose Alibaba traces ``bench/scheduler_trace.py`` replays):
the free GPUs of a node are a *fragment* for a task shape when that shape
cannot use them there, because it needs more GPUs than the node has free or
because it is pinned to other GPU models. A node's expected fragmentation
is the fragment size averaged over the expected task mix; a placement is
scored by how much it changes that figure, and the node it grows least (or
shrinks most) wins.

That rule covers what tightest-node packing misses: taking one GPU of an
empty 8-GPU node costs the mix's 8-GPU jobs seven GPUs, while topping up a
partly used node costs nothing it had not already lost. Only shapes that
can use a model count for its nodes' fragments.

Which GPU model a flexible job takes is decided first, by its *pull*
(``FragTable.pull``). A model's *pressure* is the GPUs that jobs pinned to
a set of models ask for, spread over that set's capacity. FGD's own answer
(a node is already a fragment for every job pinned elsewhere) weighs pinned
jobs by how many there are, not by how scarce their models are, and so
sends flexible jobs onto a small, contended model because the many jobs
pinned to an abundant one cannot use it. With pressure, a job that may run
anywhere stays off the models that pinned jobs need, and pinned jobs stop
waiting for GPUs that flexible jobs could have taken elsewhere.

Pressure alone fills the least pinned model first, to its last GPU, while
others sit half idle: on the ``gpuspec20`` replay at load 1 flexible jobs
took every GPU of the 8-GPU G2 nodes while half of the T4 GPUs (2 per node,
pressure 0.5-0.6 from their running pinned jobs) stayed free, and 8-GPU
tasks found no empty node (281 s mean wait against first-fit's 165 s). So
the pull is the larger of the pressure and the share of the room pinned
jobs leave on the model (its capacity less their GPUs) that is in use: the
flexible jobs spread over the models as they fill, and a model whose
pinned jobs ask for all of it is never a flexible job's first choice.

Neither figure sees a pinned job that waits for a whole node of its model
while the model has GPUs free on partly used nodes. Flexible jobs went
there, each landing where a node was about to empty: on the ``gpuspec25``
replays one G3-pinned 8-GPU task waited 17,339 s against first-fit's
7,001 s while flexible tasks kept landing on G3 nodes. A model such a job
holds capacity on (``waited``) comes after every other model.

The mix is the shapes of the jobs the cycle sees, running and pending, so
it follows the cluster's own workload with nothing to configure; before
any job exists it is empty and every placement scores 0 (the pull still
spreads jobs over the models; within one the tightest node decides).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

INF = float("inf")

Shape = tuple[int, frozenset[str]]
"""(GPUs one slot needs on one node, models it accepts; empty = any)."""
Demand = Mapping[Shape, tuple[float, float]]
"""Per shape: (jobs, GPUs) running and queued."""


class FragTable:
    """Expected fragmentation per (GPU model, free GPUs), precomputed once
    per cycle: ``delta(model, free, take)`` is then a table look-up."""

    __slots__ = ("_frag", "weight", "pressure", "_room", "waited")

    def __init__(self, demand: Demand, models: Mapping[str, int],
                 capacity: Mapping[str, int], waited: Iterable[str] = ()) -> None:
        """``demand``: jobs and GPUs per task shape; ``models``: most GPUs a
        node of each model has; ``capacity``: GPUs of each model;
        ``waited``: models a pinned job waits on to empty a node."""
        self.weight = sum(jobs for jobs, _ in demand.values())
        self.waited = frozenset(waited)
        self._frag: dict[str, list[float]] = {}
        self.pressure: dict[str, float] = dict.fromkeys(models, 0.0)
        """Per model: GPUs pinned jobs ask of it per GPU it has."""
        self._room = {m: float(capacity.get(m, 0)) for m in models}
        """Per model: GPUs its pinned jobs leave to the others."""
        if self.weight <= 0:
            return
        for model, top in models.items():
            usable = [(need, jobs) for (need, pinned), (jobs, _) in demand.items()
                      if not pinned or model in pinned]
            # Kept as GPUs x jobs, not yet divided by the weight: with whole
            # job counts every entry and every difference is an exact
            # integer, so placements that leave the same fragmentation tie
            # exactly and the tie-breaks (tightest node first) decide, not
            # rounding ((f - 1) / w - f / w differs in its last bit from
            # (g - 1) / w - g / w).
            self._frag[model] = [free * sum(j for need, j in usable if need > free)
                                 for free in range(top + 1)]
        for (_, pinned), (_, gpus) in demand.items():
            within = [m for m in pinned if m in capacity]
            if not within or len(within) == len(capacity):
                continue  # pinned to nothing here, or to everything: no pull
            share = gpus / max(1, sum(capacity[m] for m in within))
            for m in within:
                self.pressure[m] += share
        for m, p in self.pressure.items():
            self._room[m] *= 1.0 - p

    def pull(self, model: str, free: int) -> float:
        """How strongly a job that may run on any model is kept off
        ``model`` while it has ``free`` free GPUs (lower goes first): the
        larger of its pressure and the share of the room its pinned jobs
        leave that is in use, after every model no pinned job waits on;
        infinite when they ask for all of it."""
        room = self._room.get(model, 0.0)
        if room <= 0:
            return INF
        pull = max(self.pressure.get(model, 0.0), 1.0 - free / room)
        return pull + 1.0 if model in self.waited else pull

    def frag(self, model: str, free: int) -> float:
        """Expected GPUs of a node with ``free`` free GPUs of ``model`` that
        the next job (drawn from the mix) could not use."""
        row = self._frag.get(model)
        if row is None or free <= 0:
            return 0.0
        return row[min(free, len(row) - 1)] / self.weight

    def delta(self, model: str, free: int, take: int) -> float:
        """Change in that figure when ``take`` of the ``free`` GPUs are used."""
        row = self._frag.get(model)
        if row is None:
            return 0.0
        return (row[free - take] - row[free]) / self.weight


def task_demand(jobs: Iterable[tuple[Shape, int]]) -> dict[Shape, tuple[float, float]]:
    """Jobs and GPUs per slot shape, from (shape, GPUs) per job."""
    out: dict[Shape, tuple[float, float]] = {}
    for shape, gpus in jobs:
        n, g = out.get(shape, (0.0, 0.0))
        out[shape] = (n + 1, g + gpus)
    return out
