"""One scheduling cycle: the entry point the scheduler shell calls.

The cycle is a short sequence of named steps (Kueue's shape):
``snapshot`` (build the incremental view), ``order`` (queue the pending
jobs), ``admit`` (for each job in order: place it, else let it preempt,
else block it and hold capacity for it), ``explain`` (reason and queue
position for every job still pending). Each job's placement is a plan that
commits only when every gang member fits (Volcano's statement). The cycle
is pure: ``now`` and the optional ``clock`` (for step timings) come from
the caller.

A blocked job stops its workspace's queue when the queue is ``fifo`` (for
the jobs that compete with it for a GPU model: a job pinned to other models
goes on); in a ``balance`` queue later jobs may backfill. Either way one
blocked job of each queue gets a reservation (see ``reservation``) so jobs
behind it and jobs of other queues cannot take the capacity it waits for,
and a workspace quota keeps room for its first quota-blocked job. The
reservation goes to the first blocked job in queue order, except that in a
``balance`` queue the first one-node jobs that fill a whole node (up to
``whole_node_holds``) claim a reservation each, ahead of it.
When the nodes held for a job last cycle can hold it, it starts there
first; then jobs that fill whole nodes start on wholly free ones, before
smaller jobs of higher priority could break those nodes up, and one-node
jobs of several GPUs start where that many are free together on a node
already in use, before one-GPU jobs take them one by one (balance queues
only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from . import explain, quota
from .fragmentation import FragTable, task_demand
from .model import (
    CycleResult,
    Job,
    Pending,
    Preemption,
    SchedulerConfig,
    Slot,
    Snapshot,
    Workspace,
)
from .ordering import order_queue
from .placement import Found, Shortfall, find_placement, measure, place_on
from .preemption import eligible, select_victims
from .request import Invalid, Request, build_request, slot_layout
from .reservation import reservation_name, reserve
from .state import (
    INF,
    NOMINATED,
    PLACED,
    RESERVATION,
    RUNNING,
    TERMINATING,
    Alloc,
    ClusterState,
    Hold,
)

T = TypeVar("T")


@dataclass(slots=True)
class Outcome:
    """What ``decide`` concluded for one job. ``reason`` is filled in by the
    explain step for capacity codes (with the numbers as of the cycle end)."""

    code: str
    reason: str = ""
    req: Request | None = None


class Cycle:
    """The state of one cycle; ``run`` does all of it, ``decide`` one job."""

    def __init__(self, snapshot: Snapshot, config: SchedulerConfig, now: float, *,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.now = now
        self.step_seconds: dict[str, float] = {}
        self._clock = clock
        self.state = self._timed("snapshot", lambda: ClusterState.from_snapshot(
            snapshot.nodes, snapshot.workspaces, snapshot.running))
        self.queue: list[Job] = self._timed("order", lambda: order_queue(
            snapshot.pending, config.priorities, (a.job.id for a in snapshot.running)))
        self._drains = self._carried_reservations(snapshot)
        if config.fragmentation_aware:
            jobs = [*(a.job for a in snapshot.running), *self.queue]
            self.state.frag = FragTable(
                task_demand(((slot_layout(j)[1], j.gpu_models), j.gpus) for j in jobs),
                self.state.model_max_gpus, self.state.model_capacity(),
                self._waited_for_whole())
        self.placements: dict[str, tuple[Slot, ...]] = {}
        self.nominations: dict[str, tuple[Slot, ...]] = {}
        self.preemptions: list[Preemption] = []
        self.outcomes: dict[str, Outcome] = {}
        self._fifo_blocked: dict[str, list[tuple[str, frozenset[str]]]] = {}
        self._holders: dict[str, set[str]] = {}  # workspace -> jobs it holds capacity for
        self._claimed: set[str] = set()  # whole-node jobs holding capacity ahead of their turn
        self._quota_reserved: dict[str, int] = {}
        self._preemption_attempts = 0
        self._failed: dict[tuple[object, ...], int] = {}
        self._victim_pool: list[Alloc] | None = None

    # -- the steps ------------------------------------------------------------

    def run(self) -> CycleResult:
        self.admit()
        return self.explain()

    def admit(self) -> None:
        """Start the jobs whose drained nodes are now free, the whole-node
        jobs and the several-GPU jobs that fit without breaking up a node,
        then decide every queued job, in order."""

        def run() -> None:
            self._honour_drains()
            stopped = self._whole_nodes_first()
            self._several_gpus_together(stopped)
            for job in self.queue:
                if job.id not in self.outcomes:
                    self.decide(job)
        self._timed("admit", run)

    def _honour_drains(self) -> None:
        """A job that held nodes last cycle starts on them once they hold
        it, before the jobs ahead of it in the queue. Nothing new landed on
        those nodes while they drained; letting a higher-priority job that
        can use any GPU take them now would start the drain over, and a big
        gang behind a stream of small jobs would never start."""
        if not self._drains:
            return
        jobs = {j.id: j for j in self.queue}
        for owner, nodes in self._drains.items():
            job = jobs.get(owner)
            if job is None or not nodes:
                continue
            req = self._request(job)
            if isinstance(req, Outcome):
                continue
            allowed, _ = quota.within(self.state, req, self._quota_reserved)
            if allowed is None:
                continue
            found = place_on(self.state, allowed, nodes)
            if found is not None:
                self._commit(allowed, found, PLACED)
                self.outcomes[owner] = Outcome("placed")

    def _whole_nodes_first(self) -> dict[str, set[str]]:
        """Jobs whose every slot fills a whole node start first, in queue
        order, on nodes that are wholly free now (no preemption, no holds).

        Such a job can use nothing else, while a smaller job (placed
        fragmentation-aware) only opens a free node when no partly used one
        has room. Decided strictly by priority, the stream of small
        high-priority jobs took each node as it emptied, stranding most of
        its GPUs, and the gangs behind them waited for another node to
        drain: on the Alibaba trace replays, 8-GPU tasks waited up to twice
        as long as under FIFO first-fit and more free GPUs sat on partly
        used nodes. Now the smaller job takes the next GPU that frees up
        on any node instead. FIFO queues keep strict order, so their jobs
        wait for their turn. A gang of several nodes that does not fit
        finds some wholly free nodes but not enough: the jobs of its queue
        that compete with it for a GPU model then wait for the main pass,
        where it holds capacity before anything behind it may backfill.

        A one-node job that does not fit finds no wholly free node of its
        models (those behind it cannot take one it could use); the first
        ``whole_node_holds`` such jobs of a queue claim a reservation each
        here, ahead of the smaller jobs before them in queue order: those
        take the next GPU that frees anywhere, while a whole-node job needs
        a node to drain, and nothing drains unless held. With the
        reservation going to the first blocked job, mostly a one-GPU job of
        high priority, the 8-GPU tasks of the default trace at load 1
        waited 243 s on average against first-fit's 163 s. With one claim
        per queue the next 8-GPU job still waited for a node to empty by
        chance; two nodes drain at once now (``gpuspec33`` at load 4: 8-GPU
        tasks 689 s to 470 s, allocation while tasks queue 0.46 to 0.59).
        When a job's turn in the main pass comes, its claim is given back
        and the job decided afresh (see ``decide``)."""
        st = self.state
        stopped: dict[str, set[str]] = {}
        for job, req in self._balance_jobs():
            if not self._fills_node(req):
                continue
            blocked = stopped.setdefault(job.workspace, set())
            if not blocked.isdisjoint(req.models):
                continue
            allowed, _ = quota.within(st, req, self._quota_reserved)
            if allowed is not None and self._place_free(allowed):
                self.outcomes[job.id] = Outcome("placed")
                continue
            if req.slots > 1:
                blocked.update(req.models)
            elif allowed is not None and self._may_claim(job.workspace):
                self._claimed.add(job.id)
                self._reserve(allowed)
        return stopped

    def _several_gpus_together(self, stopped: dict[str, set[str]]) -> None:
        """One-node jobs of several GPUs, but less than a whole node, start
        next, in queue order, where their GPUs are free together on a node
        already in use. ``stopped``: per queue, the GPU models of the gangs
        ``_whole_nodes_first`` found blocked.

        A one-GPU job takes any GPU that frees up; a 4-GPU job needs four
        free on one node at once. Decided strictly by priority, a stream
        of one-GPU high-priority jobs took every GPU as it freed, and the
        2- and 4-GPU jobs of lower priority waited until the stream ended,
        then again until the one-to-three-GPU holes the stream left behind
        merged. Replaying ``multigpu30`` at load 1, a 4-GPU job was the
        smallest one waiting for 8.5% of the time that tasks queued, while
        134 GPUs sat free on average; allocation while tasks queued was
        0.992 against FIFO first-fit's 0.999. The jobs behind take the
        next GPUs that free up anywhere instead.

        Such a job does not open an empty node here (whole-node jobs need
        those, and in its turn it still may), take GPUs of a node drained
        for a blocked job, or pass a job of its queue that will hold the GPU
        models it competes for: a blocked gang, or the first job found not
        to fit while the queue holds nothing (it holds what it waits for in
        its turn, and the job behind would outlast it there). It goes after
        the whole-node jobs, whose claims hold their drains first. FIFO
        queues keep strict order."""
        st = self.state
        waiting = {ws: set(models) for ws, models in stopped.items()}
        for job, req in self._balance_jobs(min_gpus=2):
            if req.slots > 1 or self._fills_node(req):
                continue
            competes = waiting.setdefault(job.workspace, set())
            allowed, _ = quota.within(st, req, self._quota_reserved)
            if allowed is None or not competes.isdisjoint(req.models):
                continue
            on_used, on_empty = self._free_together(allowed)
            found = self._found_free(allowed) if on_used else None
            if found is None:
                # Fits nowhere now: the queue's first such job holds what it
                # waits for in its turn.
                if (on_used or not on_empty) and self._may_reserve(job.workspace):
                    competes.update(req.models)
                continue
            drained = self._drained_for_others(allowed)
            if all(st.free[i] < st.gpus[i] and i not in drained for i in found.per_node):
                self._commit(allowed, found, PLACED)
                self.outcomes[job.id] = Outcome("placed")

    def _balance_jobs(self, min_gpus: int = 0) -> Iterator[tuple[Job, Request]]:
        """The jobs of balance queues not decided yet, in queue order, with
        their requests; ``min_gpus`` skips smaller jobs before their request
        is built."""
        for job in self.queue:
            if job.id in self.outcomes or job.gpus < min_gpus:
                continue
            ws = self.state.workspaces.get(job.workspace)
            if ws is None or ws.queue_policy == "fifo":
                continue
            req = self._request(job)
            if not isinstance(req, Outcome):
                yield job, req

    def _fills_node(self, req: Request) -> bool:
        """Whether each slot takes a node as large as any of its models has."""
        return req.slot_gpus >= max(self.state.model_max_gpus[m] for m in req.models)

    def _free_together(self, req: Request) -> tuple[bool, bool]:
        """Whether nodes of the job's GPU models have ``slot_gpus`` free: a
        node already in use, and an empty one. Read from the per-model
        class counters (pools and excluded nodes aside), so that a job with
        no room on a used node costs no search."""
        on_used = on_empty = False
        for model in req.models:
            counts = self.state.model_counts.get(model)
            if counts is not None:
                used, empty = counts.room(req.slot_gpus)
                on_used, on_empty = on_used or used, on_empty or empty
        return on_used, on_empty

    def decide(self, job: Job) -> str:
        """Nominate, place tentatively, commit or block one job; its code."""
        if job.id in self._claimed:
            # Its claim (see _whole_nodes_first) kept the jobs ahead of it
            # off the nodes it waits for; now it may start elsewhere (on
            # lent GPUs) or preempt. Blocked again, it holds again (_block).
            self._holders[job.workspace].discard(job.id)
            if reservation_name(job.id) in self.state.holds:
                self.state.unhold(reservation_name(job.id))
                self._failed.clear()  # the held GPUs are free again
        outcome = self._decide(job)
        self._claimed.discard(job.id)
        self.outcomes[job.id] = outcome
        return outcome.code

    def explain(self) -> CycleResult:
        """Reasons and queue positions for the jobs still pending; the result."""
        return self._timed("explain", self._result)

    def _result(self) -> CycleResult:
        pending: dict[str, Pending] = {}
        positions: dict[str, int] = {}
        shortfalls: dict[object, Shortfall] = {}
        for job in self.queue:
            out = self.outcomes.get(job.id) or Outcome("unconsidered", "not considered yet")
            if out.code == "placed":
                continue
            positions[job.workspace] = positions.get(job.workspace, 0) + 1
            reason = out.reason or self._capacity_reason(out.req, shortfalls)
            held = self.state.holds.get(reservation_name(job.id))
            if held is not None:
                reason += explain.holding(held.gpus, self._racks_of(held), held.until, self.now)
            pending[job.id] = Pending(positions[job.workspace], reason, out.code)
        nodes = self.state.nodes
        reservations = {h.owner: tuple(nodes[i].name for i in sorted(h.per_node))
                        for h in self.state.holds.values() if h.kind == RESERVATION}
        return CycleResult(dict(self.placements), tuple(self.preemptions), pending,
                           dict(self.nominations), reservations,
                           tuple(j.id for j in self.queue), dict(self.step_seconds))

    # -- one job --------------------------------------------------------------

    def _decide(self, job: Job) -> Outcome:
        blocker = self._fifo_blocker(job)
        if blocker is not None:
            return Outcome("fifo", explain.behind(blocker, job.workspace))
        req = self._request(job)
        if isinstance(req, Outcome):
            return req
        ws = self.state.workspaces[job.workspace]
        allowed, quota_reason = quota.within(self.state, req, self._quota_reserved)
        if allowed is not None:
            placed = self._place(allowed)
            if placed is not None:
                return placed
        preempted = self._preempt(req, ws,
                                  quota_short=quota.short(self.state, req, self._quota_reserved))
        if preempted is not None:
            return preempted
        return self._block(allowed or req, ws, quota_reason)

    def _request(self, job: Job) -> Request | Outcome:
        """The job as a placement request, or why it can never be placed."""
        try:
            req = build_request(job, self.state, self.config)
        except Invalid as bad:
            return Outcome(bad.code, bad.reason)
        never = quota.beyond(self.state.workspaces[job.workspace], req)
        return Outcome("invalid", never) if never else req

    def _place(self, req: Request) -> Outcome | None:
        """Free GPUs first; then GPUs held for a head job the job will have
        left before; then GPUs that preempted jobs are releasing (wait)."""
        st = self.state
        if self._place_free(req):
            return Outcome("placed")
        need = req.need
        free = st.free_gpus(req.models, req.pools)
        lend: list[Hold] = []
        runtime = req.job.expected_runtime_s
        if runtime is not None:
            lend = [h for h in st.holds.values()
                    if h.kind == RESERVATION and h.until >= self.now + runtime]
            if lend and free + sum(h.gpus for h in lend) >= need \
                    and self._with_lent(req, lend, PLACED) is not None:
                return Outcome("placed")
        term = [h for h in st.holds.values() if h.kind == TERMINATING]
        if term and free + sum(h.gpus for h in term + lend) >= need \
                and not self._known_failure("term", req):
            found = self._with_lent(req, term + lend, NOMINATED, waits_on=term)
            if found is not None:
                owners = [h.owner for h in term if not found.per_node.keys().isdisjoint(h.per_node)]
                return Outcome("waiting", explain.waiting(owners)) if owners else Outcome("placed")
            self._remember_failure("term", req)
        return None

    def _found_free(self, req: Request) -> Found | None:
        """Where ``req`` fits on GPUs free now (nothing held lent, nobody
        preempted), steered off nodes drained for others; None if nowhere
        (remembered for the cycle, so its shape is not tried again)."""
        st = self.state
        if st.free_gpus(req.models, req.pools) < req.need or self._known_failure("free", req):
            return None
        found = find_placement(st, req)
        if isinstance(found, Found):
            return self._steer(req, found)
        self._remember_failure("free", req)
        return None

    def _place_free(self, req: Request) -> bool:
        """Place ``req`` where ``_found_free`` finds room; False if nowhere."""
        found = self._found_free(req)
        if found is not None:
            self._commit(req, found, PLACED)
        return found is not None

    def _carried_reservations(self, snapshot: Snapshot) -> dict[str, list[int]]:
        """Last cycle's reservations whose owner still waits: node indices."""
        waiting = {j.id for j in self.queue}
        index = self.state.index
        return {owner: [index[n] for n in names if n in index]
                for owner, names in sorted(snapshot.reservations.items()) if owner in waiting}

    def _waited_for_whole(self) -> set[str]:
        """GPU models that a job pinned to them, needing a whole node of
        them, held last cycle and still waits for. A node of such a model
        empties only if nothing new lands on it; jobs that may run
        elsewhere go there last (``FragTable.pull``)."""
        every = self.state.model_max_gpus.keys()
        out: set[str] = set()
        for job in self.queue:
            if job.id not in self._drains or not job.gpu_models or job.gpu_models >= every:
                continue
            req = self._request(job)
            if not isinstance(req, Outcome) and self._fills_node(req):
                out.update(req.models)
        return out

    def _steer(self, req: Request, found: Found) -> Found:
        """Move a placement off nodes being drained for a blocked job when
        it fits as well (no more racks) elsewhere."""
        avoid = self._drained_for_others(req)
        if not avoid or found.per_node.keys().isdisjoint(avoid) \
                or self._known_failure("steer", req):
            return found
        with self.state.what_if():
            for i in avoid:
                self.state.mask(i)
            other = find_placement(self.state, req)
        if isinstance(other, Found):
            return other if other.racks <= found.racks else found
        self._remember_failure("steer", req)
        return found

    def _drained_for_others(self, req: Request) -> set[int]:
        """Nodes held last cycle for a blocked job other than ``req``'s that
        has not started yet."""
        return {i for owner, nodes in self._drains.items()
                if owner != req.job.id and owner not in self.placements for i in nodes}

    def _with_lent(self, req: Request, holds: list[Hold], kind: str, *,
                   waits_on: Sequence[Hold] = ()) -> Found | None:
        """Place ``req`` as if ``holds`` were free, then hold what is left.
        The job waits (``kind``) only if it lands on ``waits_on`` nodes."""
        st = self.state
        with st.what_if() as plan:
            saved = [st.unhold(h.name) for h in holds]
            found = find_placement(st, req)
            if not isinstance(found, Found):
                return None
            if waits_on and all(found.per_node.keys().isdisjoint(h.per_node) for h in waits_on):
                kind = PLACED
            self._commit(req, found, kind)
            for h in saved:
                st.hold(h.name, h.kind, h.owner,
                        {i: min(g, st.eff_free(i)) for i, g in h.per_node.items()}, h.until)
            plan.commit()
        return found

    def _commit(self, req: Request, found: Found, kind: str) -> None:
        self.state.allocate(req.job, found.per_node, kind)
        names = self.state.nodes
        ranks = tuple((names[i].name, g) for i, g in found.ranks)
        (self.placements if kind == PLACED else self.nominations)[req.job.id] = ranks

    def _preempt(self, req: Request, ws: Workspace, *, quota_short: int) -> Outcome | None:
        cfg, st = self.config, self.state
        if not (cfg.preemption and ws.preemption) \
                or self._preemption_attempts >= cfg.max_preemption_attempts:
            return None
        stage = ("preempt", req.priority, req.job.workspace, quota_short)
        if self._known_failure(stage, req):
            return None
        candidates = [a for a in self._victims_below(req.priority)
                      if st.allocs.get(a.job.id) is a
                      and eligible(a, req, now=self.now, config=cfg, state=st)]
        if not candidates:
            self._remember_failure(stage, req)
            return None
        self._preemption_attempts += 1
        with st.what_if() as plan:
            releasing = [st.unhold(h.name) for h in list(st.holds.values())
                         if h.kind == TERMINATING]
            choice = select_victims(st, req, candidates, now=self.now,
                                    priorities=cfg.priorities, fits=lambda: self._fits(req),
                                    max_checks=cfg.max_victim_checks, quota_short=quota_short)
            if choice is None:
                plan.discard()
                self._remember_failure(stage, req)
                return None
            for victim in choice.victims:
                st.release(victim.job.id)
            self._commit(req, choice.found, NOMINATED)
            for h in releasing:
                st.hold(h.name, h.kind, h.owner,
                        {i: min(g, st.eff_free(i)) for i, g in h.per_node.items()}, h.until)
            for victim in choice.victims:
                st.hold(victim.job.id, TERMINATING, victim.job.id,
                        {i: min(g, st.eff_free(i)) for i, g in victim.per_node.items()}, INF)
            plan.commit()
        ids = [v.job.id for v in choice.victims]
        for victim in choice.victims:
            requeue = replace(victim.job, started_at=None, preempted=True)
            self.preemptions.append(Preemption(victim.job.id, req.job.id, requeue))
        self._failed.clear()  # victims' GPUs moved from running to releasing
        return Outcome("preempting", explain.preempting(ids), req)

    def _fits(self, req: Request) -> Found | None:
        allowed, _ = quota.within(self.state, req, self._quota_reserved)
        if allowed is None:
            return None
        found = find_placement(self.state, allowed)
        return found if isinstance(found, Found) else None

    def _victims_below(self, priority: int) -> list[Alloc]:
        if self._victim_pool is None:
            prio = self.config.priorities
            self._victim_pool = sorted(
                (a for a in self.state.allocs.values() if a.kind == RUNNING),
                key=lambda a: (prio.get(a.job.priority, 0), a.job.id))
        prio = self.config.priorities
        out = []
        for alloc in self._victim_pool:
            if prio.get(alloc.job.priority, 0) >= priority:
                break
            out.append(alloc)
        return out

    def _block(self, req: Request, ws: Workspace, quota_reason: str) -> Outcome:
        job = req.job
        if quota_reason:
            out = Outcome("quota", quota_reason, req)
            self._quota_reserved.setdefault(ws.name, req.need)
        else:
            owners = self._held_for(req)
            out = (Outcome("held", explain.held(owners, self._held_until(owners), self.now), req)
                   if owners else Outcome("capacity", "", req))
            if job.id in self._claimed or self._may_reserve(ws.name):
                self._reserve(req)
        if ws.queue_policy == "fifo":
            self._fifo_blocked.setdefault(ws.name, []).append((job.id, frozenset(req.models)))
        return out

    def _may_reserve(self, workspace: str) -> bool:
        """One blocked job of a queue holds capacity (unless its whole-node
        jobs claimed it), and at most ``max_reservations`` in all."""
        return not self._holders.get(workspace) and self._holding() < self.config.max_reservations

    def _may_claim(self, workspace: str) -> bool:
        """Up to ``whole_node_holds`` whole-node jobs of a queue claim it."""
        return len(self._holders.get(workspace, ())) < self.config.whole_node_holds \
            and self._holding() < self.config.max_reservations

    def _holding(self) -> int:
        return sum(map(len, self._holders.values()))

    def _reserve(self, req: Request) -> None:
        self._holders.setdefault(req.job.workspace, set()).add(req.job.id)
        reserve(self.state, req, now=self.now,
                carried=frozenset(self._drains.get(req.job.id, ())))

    def _fifo_blocker(self, job: Job) -> str | None:
        """The blocked job of a FIFO queue that ``job`` must wait behind:
        one that competes with it for a GPU model. A job pinned only to
        models the blocked jobs cannot use takes nothing they wait for."""
        for blocker, models in self._fifo_blocked.get(job.workspace, ()):
            if not job.gpu_models or not models or not job.gpu_models.isdisjoint(models):
                return blocker
        return None

    def _held_for(self, req: Request) -> list[str]:
        """Owners of reservations the job would fit into, if any."""
        st = self.state
        holds = [h for h in st.holds.values() if h.kind == RESERVATION]
        if not holds or self._known_failure("held", req):
            return []
        if st.free_gpus(req.models, req.pools) + sum(h.gpus for h in holds) < req.need:
            return []
        with st.what_if():
            for h in holds:
                st.unhold(h.name)
            found = find_placement(st, req)
        if not isinstance(found, Found):
            self._remember_failure("held", req)
            return []
        return [h.owner for h in holds if not found.per_node.keys().isdisjoint(h.per_node)]

    def _held_until(self, owners: Sequence[str]) -> float:
        holds = [self.state.holds.get(reservation_name(o)) for o in owners]
        return min((h.until for h in holds if h is not None), default=INF)

    def _capacity_reason(self, req: Request | None, cache: dict[object, Shortfall]) -> str:
        if req is None:
            return "not considered"
        own = self.state.holds.get(reservation_name(req.job.id))
        if own is not None:  # its own held GPUs are free for it
            with self.state.what_if():
                self.state.unhold(own.name)
                return explain.capacity(self.state, req, measure(self.state, req))
        key = req.shape
        short = cache.get(key) if key is not None else None
        if short is None:
            short = measure(self.state, req)
            if key is not None:
                cache[key] = short
        return explain.capacity(self.state, req, short)

    # -- helpers --------------------------------------------------------------

    def _racks_of(self, held: Hold) -> list[str]:
        st = self.state
        return sorted({st.nodes[i].rack or "(unlabelled)" for i in held.per_node})

    def _known_failure(self, stage: object, req: Request) -> bool:
        """Capacity only shrinks within a cycle (until a preemption or a
        claim given back), so a request that failed at size n fails at any
        size >= n."""
        shape = req.shape
        if shape is None:
            return False
        smallest = self._failed.get((stage, shape))
        return smallest is not None and req.units >= smallest

    def _remember_failure(self, stage: object, req: Request) -> None:
        shape = req.shape
        if shape is not None:
            key = (stage, shape)
            self._failed[key] = min(self._failed.get(key, req.units), req.units)

    def _timed(self, step: str, fn: Callable[[], T]) -> T:
        if self._clock is None:
            return fn()
        start = self._clock()
        value = fn()
        self.step_seconds[step] = self._clock() - start
        return value


def schedule(snapshot: Snapshot, config: SchedulerConfig, now: float, *,
             clock: Callable[[], float] | None = None) -> CycleResult:
    """Decide one cycle over ``snapshot`` at time ``now`` (seconds)."""
    cycle = Cycle(snapshot, config, now, clock=clock)  # steps: snapshot, order
    cycle.admit()  # per job: place tentatively, commit | preempt | block and reserve
    return cycle.explain()  # reasons and positions for the rest
