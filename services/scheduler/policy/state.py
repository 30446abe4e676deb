"""The mutable view of the cluster that one scheduling cycle works on.

Built once per cycle from a ``Snapshot``, then updated incrementally as the
cycle places, holds and evicts: free GPUs per node, per cell and per GPU
model, and GPUs in use per workspace (for quotas). Every change can be made
tentatively inside a ``Plan`` (Volcano's statement, Kueue's what-if): the
plan logs the inverse of each operation, ``commit`` keeps the changes and
``discard`` (or leaving the ``with`` block without committing) undoes them in
reverse order. Plans nest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from .fragmentation import FragTable
from .model import Allocation, Job, Node, Workspace
from .topology import Cell, ModelCounts, topo_key

RUNNING = "running"
PLACED = "placed"
NOMINATED = "nominated"
TERMINATING = "terminating"
RESERVATION = "reservation"

_Undo = tuple[Callable[..., Any], tuple[Any, ...]]
INF = float("inf")


class Alloc:
    """GPUs a job holds, per node index. ``kind``: running before this cycle,
    placed by it, or nominated (placed onto GPUs still being released)."""

    __slots__ = ("job", "per_node", "kind", "gpus")

    def __init__(self, job: Job, per_node: dict[int, int], kind: str) -> None:
        self.job = job
        self.per_node = per_node
        self.kind = kind
        self.gpus = sum(per_node.values())


class Hold:
    """GPUs kept from general use: a preempted job still releasing them
    (``terminating``), or capacity kept for a blocked head job
    (``reservation``; ``until`` is when it is expected to be usable)."""

    __slots__ = ("name", "kind", "owner", "per_node", "until", "gpus")

    def __init__(self, name: str, kind: str, owner: str, per_node: dict[int, int],
                 until: float) -> None:
        self.name = name
        self.kind = kind
        self.owner = owner
        self.per_node = per_node
        self.until = until
        self.gpus = sum(per_node.values())


def _job_id(allocation: Allocation) -> str:
    return allocation.job.id


class ClusterState:
    """Nodes in topology order (index = position), with incremental counters."""

    def __init__(self, nodes: Sequence[Node], workspaces: Iterable[Workspace],
                 running: Iterable[Allocation] = ()) -> None:
        seen: set[str] = set()
        unique = []
        for node in nodes:
            if node.name not in seen:
                seen.add(node.name)
                unique.append(node)
        self.nodes: list[Node] = sorted(unique, key=topo_key)
        self.index: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        self.gpus: list[int] = [max(0, n.gpus) for n in self.nodes]
        self.free: list[int] = list(self.gpus)
        self.masked = bytearray(len(self.nodes))
        self.degraded: list[int] = [i for i, n in enumerate(self.nodes) if n.degraded]
        self.workspaces: dict[str, Workspace] = {w.name: w for w in workspaces}
        self.cells: list[Cell] = []
        self.cell_of: list[Cell | None] = [None] * len(self.nodes)
        self.rack_names: list[str] = []
        self.rack_switch: list[str] = []
        self.model_racks: dict[str, list[tuple[int, list[Cell]]]] = {}
        self.model_free: dict[str, int] = {}
        self.model_max_gpus: dict[str, int] = {}
        self.model_counts: dict[str, ModelCounts] = {}
        """Per GPU model: the counters its cells share (``ModelCounts``)."""
        self.rack_caps: dict[tuple[object, ...], Any] = {}
        """Placement's rack offers per model and request shape, kept for the
        cycle (``rack_offers.RackOffer``; typed loosely, that module reads
        this one)."""
        self.allocs: dict[str, Alloc] = {}
        self.holds: dict[str, Hold] = {}
        self.ws_used: dict[str, int] = {}
        self.ws_model_used: dict[tuple[str, str], int] = {}
        self._node_jobs: list[set[str]] | None = None
        self.frag: FragTable | None = None
        """Expected fragmentation for the cycle's task mix; None: tightest node."""
        self._log: list[_Undo] | None = None
        self._load(running)
        self._build_cells()

    @classmethod
    def from_snapshot(cls, nodes: Sequence[Node], workspaces: Iterable[Workspace],
                      running: Iterable[Allocation]) -> ClusterState:
        return cls(nodes, workspaces, running)

    def _load(self, running: Iterable[Allocation]) -> None:
        """Record running jobs (terminating ones as holds) before the cell
        counters exist, so loading costs O(slots), not O(slots x log)."""
        index, free, allocs, holds = self.index, self.free, self.allocs, self.holds
        model_of = [n.gpu_model for n in self.nodes]
        ws_used, ws_model_used = self.ws_used, self.ws_model_used
        for allocation in sorted(running, key=_job_id):
            job = allocation.job
            if job.id in allocs or job.id in holds:
                continue
            per_node: dict[int, int] = {}
            for name, gpus in allocation.slots:
                i = index.get(name)
                if i is not None and gpus > 0:
                    per_node[i] = per_node.get(i, 0) + gpus
            for i, g in per_node.items():
                free[i] -= g
            if allocation.terminating:
                if per_node:
                    holds[job.id] = Hold(job.id, TERMINATING, job.id, per_node, INF)
                continue
            alloc = allocs[job.id] = Alloc(job, per_node, RUNNING)
            ws = job.workspace
            for i, g in per_node.items():
                key = (ws, model_of[i])
                ws_model_used[key] = ws_model_used.get(key, 0) + g
            ws_used[ws] = ws_used.get(ws, 0) + alloc.gpus

    def _build_cells(self) -> None:
        keyed: dict[tuple[str, str, str, str, int], Cell] = {}
        rack_ids: dict[tuple[str, str], int] = {}
        for i, node in enumerate(self.nodes):
            if node.state != "ready" or self.gpus[i] == 0:
                continue
            rack = (node.switch, node.rack)
            if rack not in rack_ids:
                rack_ids[rack] = len(self.rack_names)
                self.rack_names.append(node.rack)
                self.rack_switch.append(node.switch)
            # One cell per node size too: a cell's wholly free nodes are then
            # exactly those with ``top`` free, so an empty 4-GPU node is not
            # taken for a partly used one among 8-GPU nodes of its model.
            cap = self.gpus[i]
            key = (node.switch, node.rack, node.gpu_model, node.pool, cap)
            cell = keyed.get(key)
            if cell is None:
                cell = keyed[key] = Cell(len(self.cells), node.switch, node.rack,
                                         rack_ids[rack], node.gpu_model, node.pool, cap)
                self.cells.append(cell)
            free = self.eff_free(i)
            cell.append(i, free)  # nodes come in index order: buckets stay sorted
            self.cell_of[i] = cell
            model = node.gpu_model
            self.model_free[model] = self.model_free.get(model, 0) + free
            self.model_max_gpus[model] = max(self.model_max_gpus.get(model, 0), cap)
        for cell in self.cells:
            racks = self.model_racks.setdefault(cell.model, [])
            if racks and racks[-1][0] == cell.rack_id:
                racks[-1][1].append(cell)
            else:
                racks.append((cell.rack_id, [cell]))
        for model, racks in self.model_racks.items():
            counts = self.model_counts[model] = ModelCounts(self.model_max_gpus[model], racks)
            for _, cells in racks:
                for cell in cells:
                    cell.counts = counts  # kept up to date by the cells from here on

    # -- reading -------------------------------------------------------------

    def eff_free(self, i: int) -> int:
        """Free GPUs of node ``i`` as the counters see them (0..gpus)."""
        f = self.free[i]
        return 0 if f < 0 else (self.gpus[i] if f > self.gpus[i] else f)

    def model_capacity(self) -> dict[str, int]:
        """GPUs of the ready nodes of each model."""
        out: dict[str, int] = {}
        for model, racks in self.model_racks.items():
            out[model] = sum(cell.nodes * cell.top for _, cells in racks for cell in cells)
        return out

    def usable(self, i: int) -> bool:
        return self.cell_of[i] is not None and not self.masked[i]

    def free_gpus(self, models: Iterable[str], pools: frozenset[str] | None) -> int:
        if pools is None:
            return sum(self.model_free.get(m, 0) for m in models)
        return sum(c.free for m in models for _, cells in self.model_racks.get(m, ())
                   for c in cells if c.pool in pools)

    def node_jobs(self, i: int) -> set[str]:
        """Ids of the jobs holding GPUs on node ``i`` (index built on first use)."""
        if self._node_jobs is None:
            self._node_jobs = [set() for _ in self.nodes]
            for alloc in self.allocs.values():
                for n in alloc.per_node:
                    self._node_jobs[n].add(alloc.job.id)
        return self._node_jobs[i]

    # -- changing (each logs its inverse when a plan is open) -----------------

    def _add_free(self, i: int, delta: int) -> None:
        old_raw = self.free[i]
        new_raw = old_raw + delta
        self.free[i] = new_raw
        cell = self.cell_of[i]
        if cell is None or self.masked[i]:
            return
        cap = self.gpus[i]
        old = 0 if old_raw < 0 else (cap if old_raw > cap else old_raw)
        new = 0 if new_raw < 0 else (cap if new_raw > cap else new_raw)
        if old != new:
            cell.move(i, old, new)
            self.model_free[cell.model] += new - old

    def allocate(self, job: Job, per_node: dict[int, int], kind: str) -> None:
        alloc = Alloc(job, per_node, kind)
        self._attach(alloc)
        if self._log is not None:
            self._log.append((self._detach, (job.id,)))

    def release(self, job_id: str) -> Alloc:
        alloc = self._detach(job_id)
        if self._log is not None:
            self._log.append((self._attach, (alloc,)))
        return alloc

    def _attach(self, alloc: Alloc) -> None:
        job_id = alloc.job.id
        ws = alloc.job.workspace
        self.allocs[job_id] = alloc
        for i, g in alloc.per_node.items():
            self._add_free(i, -g)
            key = (ws, self.nodes[i].gpu_model)
            self.ws_model_used[key] = self.ws_model_used.get(key, 0) + g
            if self._node_jobs is not None:
                self._node_jobs[i].add(job_id)
        self.ws_used[ws] = self.ws_used.get(ws, 0) + alloc.gpus

    def _detach(self, job_id: str) -> Alloc:
        alloc = self.allocs.pop(job_id)
        ws = alloc.job.workspace
        for i, g in alloc.per_node.items():
            self._add_free(i, g)
            self.ws_model_used[(ws, self.nodes[i].gpu_model)] -= g
            if self._node_jobs is not None:
                self._node_jobs[i].discard(job_id)
        self.ws_used[ws] -= alloc.gpus
        return alloc

    def hold(self, name: str, kind: str, owner: str, per_node: dict[int, int],
             until: float) -> None:
        # A reservation is kept even with nothing free yet: it names the nodes
        # being drained. A release with nothing left to release is dropped.
        keep = kind == RESERVATION
        held = Hold(name, kind, owner, {i: g for i, g in per_node.items() if g > 0 or keep}, until)
        if (held.gpus == 0 and not keep) or name in self.holds:
            return
        self._attach_hold(held)
        if self._log is not None:
            self._log.append((self._detach_hold, (name,)))

    def unhold(self, name: str) -> Hold:
        held = self._detach_hold(name)
        if self._log is not None:
            self._log.append((self._attach_hold, (held,)))
        return held

    # A reservation names every node it drains, most with nothing held yet
    # (0 GPUs); skipping those keeps a backfill what-if, which unholds and
    # holds every reservation, from costing a pass over hundreds of nodes.
    def _attach_hold(self, held: Hold) -> None:
        self.holds[held.name] = held
        for i, g in held.per_node.items():
            if g:
                self._add_free(i, -g)

    def _detach_hold(self, name: str) -> Hold:
        held = self.holds.pop(name)
        for i, g in held.per_node.items():
            if g:
                self._add_free(i, g)
        return held

    def mask(self, i: int) -> None:
        """Hide node ``i`` from placement (e.g. a job's excluded nodes)."""
        cell = self.cell_of[i]
        if cell is None or self.masked[i]:
            return
        free = self.eff_free(i)
        cell.remove(i, free)
        self.model_free[cell.model] -= free
        self.masked[i] = 1
        if self._log is not None:
            self._log.append((self._unmask, (i,)))

    def _unmask(self, i: int) -> None:
        cell = self.cell_of[i]
        if cell is None or not self.masked[i]:
            return
        self.masked[i] = 0
        free = self.eff_free(i)
        cell.add(i, free)
        self.model_free[cell.model] += free

    def what_if(self) -> Plan:
        """Open a plan: changes until ``commit`` are undone on ``discard``."""
        return Plan(self)


class Plan:
    """A tentative set of changes to a ``ClusterState``, kept or undone whole.

    Use as ``with state.what_if() as plan: ...; plan.commit()``; leaving the
    block without committing undoes everything done inside it.
    """

    __slots__ = ("state", "_log", "_parent", "_open")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._log: list[_Undo] = []
        self._parent = state._log
        self._open = True
        state._log = self._log

    def commit(self) -> None:
        self._close()
        if self._parent is not None:
            self._parent.extend(self._log)

    def discard(self) -> None:
        self._close()
        self.state._log = None
        for undo, args in reversed(self._log):
            undo(*args)
        self.state._log = self._parent

    def _close(self) -> None:
        if not self._open:
            raise RuntimeError("plan already closed")
        if self.state._log is not self._log:
            raise RuntimeError("plans must close innermost first")
        self._open = False
        self.state._log = self._parent

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._open:
            self.discard()


def per_node_of(slots: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Sum GPUs per node index over (node index, GPUs) worker slots."""
    out: dict[int, int] = {}
    for i, g in slots:
        out[i] = out.get(i, 0) + g
    return out
