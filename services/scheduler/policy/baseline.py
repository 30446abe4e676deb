"""Plain FIFO first-fit and best-fit schedulers, kept as yardsticks for
benchmarks.

Jobs in submission order (no priorities, no preemption, no quotas), each
worker on the first ready node in name order with enough free GPUs, gangs
all-or-nothing, a job that does not fit is skipped (greedy, so the queue
does not stall behind it). It is what a cluster gets without a scheduler
of its own, and what the policy's topology, packing and fairness are
measured against. ``BestFit`` is the same but puts each worker on the
tightest node that holds it (least free GPUs left), the classic packing
heuristic against fragmentation. Not used by the service.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .model import Allocation, Job, Node, Slot


class FirstFit:
    """Free GPUs per node in name order; ``decide`` places one job or not."""

    def __init__(self, nodes: Sequence[Node], running: Iterable[Allocation] = ()) -> None:
        ready = sorted((n for n in nodes if n.state == "ready"), key=lambda n: n.name)
        self.names = [n.name for n in ready]
        self.models = [n.gpu_model for n in ready]
        self.free = [n.gpus for n in ready]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.total_free = sum(self.free)
        for alloc in running:
            for name, gpus in alloc.slots:
                i = self.index.get(name)
                if i is not None:
                    self.free[i] -= gpus
                    self.total_free -= gpus

    def decide(self, job: Job) -> tuple[Slot, ...] | None:
        """Place ``job`` (and hold its GPUs) or None when it does not fit."""
        need = job.workers * job.gpus_per_worker
        if need > self.total_free:
            return None
        chosen = self._choose(job)
        if chosen is None:
            return None
        g = job.gpus_per_worker
        for i in chosen:
            self.free[i] -= g
        self.total_free -= need
        return tuple((self.names[i], g) for i in chosen)

    def _choose(self, job: Job) -> list[int] | None:
        """A node index per worker: the first nodes in name order (the loop
        is the benchmarks' baseline speed: kept to local names)."""
        g = job.gpus_per_worker
        models = job.gpu_models
        chosen: list[int] = []
        left = job.workers
        for i, f in enumerate(self.free):
            if f < g or (models and self.models[i] not in models):
                continue
            k = min(f // g, left)
            chosen.extend([i] * k)
            left -= k
            if left == 0:
                return chosen
        return None

    def release(self, slots: Iterable[Slot]) -> None:
        for name, gpus in slots:
            i = self.index.get(name)
            if i is not None:
                self.free[i] += gpus
                self.total_free += gpus


class BestFit(FirstFit):
    """FIFO, each worker on the ready node with the fewest free GPUs that
    still holds it (ties: name order)."""

    def _choose(self, job: Job) -> list[int] | None:
        g = job.gpus_per_worker
        models = job.gpu_models
        taken: dict[int, int] = {}
        for _ in range(job.workers):
            best, best_left = -1, 0
            for i, f in enumerate(self.free):
                left = f - taken.get(i, 0) * g
                if left < g or (models and self.models[i] not in models):
                    continue
                if best < 0 or left < best_left:
                    best, best_left = i, left
                    if left == g:
                        break  # an exact fit: none is tighter
            if best < 0:
                return None
            taken[best] = taken.get(best, 0) + 1
        return [i for i, k in sorted(taken.items()) for _ in range(k)]


def fifo_first_fit(nodes: Sequence[Node], running: Iterable[Allocation],
                   pending: Iterable[Job]) -> dict[str, tuple[Slot, ...]]:
    """Place ``pending`` in submission order; job id -> slots for those placed."""
    ff = FirstFit(nodes, running)
    out: dict[str, tuple[Slot, ...]] = {}
    for job in sorted(pending, key=lambda j: (j.submitted_at, j.id)):
        slots = ff.decide(job)
        if slots is not None:
            out[job.id] = slots
    return out
