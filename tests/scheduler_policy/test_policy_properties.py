"""Properties of the policy over seeded random workloads (no hypothesis needed)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from policy_kit import NOW, check_cycle, job, rack
from policy_random import random_snapshot

from services.scheduler.policy import (
    Allocation,
    ClusterState,
    Cycle,
    Job,
    SchedulerConfig,
    Snapshot,
    Workspace,
    build_request,
    find_placement,
    placement,
    schedule,
)
from services.scheduler.policy.domains import RackCap, choose_from_switches, choose_racks
from services.scheduler.policy.placement import (
    Found,
    _find_one_node,
    _most_on_a_node,
)
from services.scheduler.policy.preemption import eligible
from services.scheduler.policy.rack_offers import RackOffer, rack_offer
from services.scheduler.policy.request import Invalid, Request
from services.scheduler.policy.state import RUNNING

CONFIG = SchedulerConfig()


@pytest.mark.parametrize("seed", range(400))
def test_every_cycle_keeps_the_invariants(seed: int) -> None:
    snap = random_snapshot(seed, NOW)
    check_cycle(snap, CONFIG, schedule(snap, CONFIG, NOW))


@pytest.mark.parametrize("seed", range(60))
def test_decisions_do_not_depend_on_input_order(seed: int) -> None:
    snap = random_snapshot(seed, NOW)
    rng = random.Random(seed)
    shuffled = Snapshot(*(rng.sample(list(x), len(x)) for x in
                          (snap.nodes, snap.workspaces, snap.running, snap.pending)))
    a, b = schedule(snap, CONFIG, NOW), schedule(shuffled, CONFIG, NOW)
    assert a.placements == b.placements
    assert a.nominations == b.nominations
    assert a.preemptions == b.preemptions
    assert a.pending == b.pending


def _fingerprint(st: ClusterState) -> tuple[Any, ...]:
    cells = [(tuple(c.hist), tuple(tuple(b) for b in c.buckets), c.nodes, c.free)
             for c in st.cells]
    return (tuple(st.free), bytes(st.masked), tuple(cells),
            tuple(sorted((m, f) for m, f in st.model_free.items())),
            tuple(sorted((k, a.kind, tuple(sorted(a.per_node.items())))
                         for k, a in st.allocs.items())),
            tuple(sorted((k, h.kind, tuple(sorted(h.per_node.items())))
                         for k, h in st.holds.items())),
            tuple(sorted((k, v) for k, v in st.ws_used.items() if v)),
            tuple(sorted((k, v) for k, v in st.ws_model_used.items() if v)),
            tuple(sorted((m, tuple(c.classes)) for m, c in st.model_counts.items())))


def _assert_counters_match_nodes(st: ClusterState) -> None:
    for cell in st.cells:
        members = [i for i, c in enumerate(st.cell_of) if c is cell and not st.masked[i]]
        hist = [0] * len(cell.hist)
        for i in members:
            hist[st.eff_free(i)] += 1
        assert hist == cell.hist
        assert cell.free == sum(st.eff_free(i) for i in members)
        assert sorted(i for b in cell.buckets for i in b) == members
    for model, counts in st.model_counts.items():
        counted = [0] * len(counts.classes)
        per_rack: list[Counter[int]] = [Counter() for _ in counts.classes]
        for i, cell in enumerate(st.cell_of):
            if cell is not None and cell.model == model and not st.masked[i]:
                counted[cell.node_class(st.eff_free(i))] += 1
                per_rack[cell.node_class(st.eff_free(i))][cell.rack_id] += 1
        assert counts.classes == counted, model
        assert counts.class_racks == [dict(c) for c in per_rack], model
        racks = st.model_racks[model]
        for rack_id, cells in racks:
            assert counts.rack_free[rack_id] == sum(c.free for c in cells)
            assert rack_id in counts.by_free[counts.rack_free[rack_id]]
        assert sum(len(r) for r in counts.by_free) == len(racks)
        assert all(bucket == sorted(bucket) for bucket in counts.by_free)


def _random_ops(st: ClusterState, rng: random.Random, n: int) -> None:
    for k in range(n):
        op = rng.random()
        usable = [i for i in range(len(st.nodes)) if st.usable(i) and st.eff_free(i) > 0]
        if op < 0.35 and usable:
            i = rng.choice(usable)
            g = rng.randint(1, st.eff_free(i))
            st.allocate(job(f"w{k}-{rng.random()}", 1, g), {i: g}, "placed")
        elif op < 0.55 and st.allocs:
            st.release(rng.choice(sorted(st.allocs)))
        elif op < 0.7 and usable:
            i = rng.choice(usable)
            st.hold(f"h{k}", "reservation", "x", {i: st.eff_free(i)}, 1.0)
        elif op < 0.8 and st.holds:
            st.unhold(rng.choice(sorted(st.holds)))
        elif usable:
            st.mask(rng.choice(usable))


@pytest.mark.parametrize("seed", range(60))
def test_what_if_plans_undo_exactly(seed: int) -> None:
    rng = random.Random(seed)
    snap = random_snapshot(seed, NOW)
    st = ClusterState.from_snapshot(snap.nodes, snap.workspaces, snap.running)
    before = _fingerprint(st)
    with st.what_if():
        _random_ops(st, rng, 20)
        middle = _fingerprint(st)
        committed = rng.random() < 0.5
        with st.what_if() as inner:
            _random_ops(st, rng, 20)
            _assert_counters_match_nodes(st)
            if committed:
                inner.commit()  # the outer plan now owns these changes too
        if not committed:
            assert _fingerprint(st) == middle
    assert _fingerprint(st) == before
    _random_ops(st, rng, 30)
    _assert_counters_match_nodes(st)


def _one_node_over_every_node(st: ClusterState, req: Request) -> int | None:
    """The one-node rule written as a pass over every node (least pulled
    model, least fragmentation added, tightest node with a partly used one
    before an empty one, fullest rack, topology order): the reference the
    class-first search must agree with."""
    table = st.frag
    assert table is not None
    best: tuple[float, float, int, int, int] | None = None
    for i, cell in enumerate(st.cell_of):
        if cell is None or st.masked[i] or cell.model not in req.models \
                or (req.pools is not None and cell.pool not in req.pools):
            continue
        free = st.eff_free(i)
        if free < req.slot_gpus:
            continue
        rack_free = sum(c.free for rack_id, cells in st.model_racks[cell.model]
                        if rack_id == cell.rack_id for c in cells
                        if req.pools is None or c.pool in req.pools)
        key = (table.pull(cell.model, st.model_free[cell.model]),
               table.delta(cell.model, free, req.slot_gpus),
               2 * free + (free == cell.top), rack_free, i)
        best = key if best is None or key < best else best
    return None if best is None else best[4]


@pytest.mark.parametrize("scan", [1 << 20, 1, 0], ids=["visit", "bounded", "compare"])
def test_one_node_search_picks_the_node_a_pass_over_every_node_picks(
        scan: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Visiting racks fullest first, comparing the racks that have the
    wanted class, or switching from one to the other
    (``placement.SCAN_PER_RACK_OF_CLASS``) must give the reference's node."""
    monkeypatch.setattr(placement, "SCAN_PER_RACK_OF_CLASS", scan)
    outcomes = {"found": 0, "none": 0}
    for seed in range(150):
        rng = random.Random(seed)
        snap = random_snapshot(seed, NOW)
        st = Cycle(snap, CONFIG, NOW).state
        _random_ops(st, rng, rng.randint(0, 25))
        for pending in snap.pending:
            for gpus in (1, 2, 4, 8):
                one = replace(pending, workers=1, gpus_per_worker=gpus, unit_workers=1,
                              prefer_nodes=frozenset(), exclude_nodes=frozenset())
                try:
                    req = build_request(one, st, CONFIG)
                except Invalid:
                    continue
                for pools in (req.pools, frozenset({"spot"})):
                    req = replace(req, pools=pools)
                    found = _find_one_node(st, req, st.frag)
                    want = _one_node_over_every_node(st, req)
                    got = next(iter(found.per_node)) if isinstance(found, Found) else None
                    assert got == want, (seed, one, pools)
                    outcomes["found" if got is not None else "none"] += 1
    assert min(outcomes.values()) > 100, outcomes


def _offer_figures(offer: RackOffer) -> tuple[Any, ...]:
    caps = [None if c is None else (c.rack_id, c.units, c.score, c.pref) for c in offer.caps]
    return offer.units, tuple(offer.slots), tuple(caps), offer.top()


def _choice(offer: RackOffer, need: int) -> tuple[Any, ...] | None:
    chosen = offer.choose(need)
    return None if chosen is None else (chosen[0], [(c.rack_id, n) for c, n in chosen[1]])


def test_kept_rack_offers_match_a_fresh_count_after_any_changes() -> None:
    """A gang's search keeps each model's rack offer for the cycle and
    recounts only the racks changed since; after placements, holds, masks
    and undone plans it must say what a fresh pass over every rack says."""
    compared = 0
    spans: Counter[int] = Counter()
    for seed in range(80):
        rng = random.Random(seed)
        snap = random_snapshot(seed, NOW)
        st = ClusterState.from_snapshot(snap.nodes, snap.workspaces, snap.running)
        shapes = []
        for pending in snap.pending:
            try:
                shapes.append(build_request(replace(pending, prefer_nodes=frozenset()), st, CONFIG))
            except Invalid:
                continue
        for _ in range(4):
            for req in shapes:
                for model in req.models:
                    kept, fresh = rack_offer(st, model, req, {}), RackOffer(st, model, req, {})
                    assert _offer_figures(kept) == _offer_figures(fresh)
                    every_rack = [c for c in fresh.caps if c is not None]
                    for need in (1, 2, 3, 5, 8):
                        want = choose_racks(every_rack, need)
                        assert _choice(kept, need) == _choice(fresh, need) == (
                            None if want is None else
                            (want[0], [(c.rack_id, n) for c, n in want[1]]))
                        spans[len({c.switch for c, _ in want[1]}) if want else 0] += 1
                    compared += 1
                    by_cells = max((f for _, cells in st.model_racks[model] for c in cells
                                    for f, n in enumerate(c.hist) if n), default=0)
                    assert _most_on_a_node(st, model, None) == by_cells
            with st.what_if() as plan:
                _random_ops(st, rng, rng.randint(1, 12))
                if rng.random() < 0.5:
                    plan.commit()
    assert compared > 1000
    assert min(spans[0], spans[1], spans[2]) > 100, spans  # none, one switch, two


def _choose_by_sorting_every_group(racks: list[RackCap], need: int) -> Any:
    """The rack choice written plainly: the best single rack, else the
    greedy largest-first pick in every switch and in the whole list, each
    sorted in full, and the best of them by (racks, switches, preferred
    nodes, score)."""
    singles = [r for r in racks if r.units >= need]
    if singles:
        r = min(singles, key=lambda r: (-r.pref, r.score, r.rack_id))
        return (1, 1, -r.pref, r.score), [(r.rack_id, need)]
    switches = list(dict.fromkeys(r.switch for r in racks))
    groups = [[r for r in racks if r.switch == s] for s in switches] if len(switches) > 1 else []
    best = None
    for group in [*groups, racks]:
        ordered = sorted(group, key=lambda r: (-r.units, -r.pref, r.score, r.rack_id))
        acc, head = 0, []
        for r in ordered:
            if acc + r.units >= need:
                break
            acc += r.units
            head.append(r)
        else:
            continue
        rest = [r for r in ordered[len(head):] if r.units >= need - acc]
        last = min(rest, key=lambda r: (-r.pref, r.score, r.rack_id))
        picked = [(r, r.units) for r in head] + [(last, need - acc)]
        key = (len(picked), len({r.switch for r, _ in picked}),
               -sum(r.pref for r, _ in picked), sum(r.score for r, _ in picked))
        if best is None or key < best[0]:
            best = (key, [(r.rack_id, n) for r, n in picked])
    return best


def test_rack_choice_is_the_one_sorting_every_switch_gives() -> None:
    """``choose_racks`` searches only the switches that can match the
    fewest racks of the whole list, and ``choose_from_switches`` combines
    each switch's own answer; both must pick what sorting every switch and
    the whole list picks, ties included."""
    compared = 0
    for seed in range(1500):
        rng = random.Random(seed)
        switches = rng.randint(1, 5)
        ids = rng.sample(range(200), rng.randint(1, 30))
        racks = [RackCap(i, f"s{rng.randrange(switches)}",
                         rng.randint(1, rng.choice((1, 2, 4, 8))), rng.randint(-20, 40),
                         rng.choice((0, 0, 0, 1, 2)), []) for i in ids]
        switches = list(dict.fromkeys(r.switch for r in racks))
        unit_counts = Counter(r.units for r in racks)
        for need in range(1, sum(r.units for r in racks) + 2):
            want = _choose_by_sorting_every_group(racks, need)
            per_switch = [choose_racks([r for r in racks if r.switch == s], need)
                          for s in switches]
            for got in (choose_racks(racks, need),
                        choose_from_switches(per_switch, need, unit_counts, lambda r=racks: r)):
                assert (None if got is None else
                        (got[0], [(r.rack_id, n) for r, n in got[1]])) == want, (seed, need)
            compared += want is not None and want[0][0] > 1
    assert compared > 10_000


@pytest.mark.parametrize("seed", range(200))
def test_gangs_use_the_fewest_racks(seed: int) -> None:
    rng = random.Random(seed)
    nodes, free_per_rack = [], []
    for r in range(rng.randint(2, 6)):
        size = rng.randint(1, 6)
        nodes += rack(f"r{r}", size, switch=f"s{r % 2}")
        free_per_rack.append(size)
    workers = rng.randint(1, sum(free_per_rack))
    caps = sorted(free_per_rack, reverse=True)
    fewest = next(k for k in range(1, len(caps) + 1) if sum(caps[:k]) >= workers)
    result = schedule(Snapshot(nodes, [Workspace("ws")], (), [job("g", workers)]), CONFIG, NOW)
    racks = {n.split("-")[0] for n, _ in result.placements["g"]}
    assert len(racks) == fewest
    if fewest == 1:
        tightest = min(c for c in free_per_rack if c >= workers)
        assert free_per_rack[int(next(iter(racks))[1:])] == tightest


def _fits_without(snap: Snapshot, preemptor: Job, gone: set[str]) -> bool:
    running = [a for a in snap.running if a.job.id not in gone and not a.terminating]
    st = ClusterState.from_snapshot(snap.nodes, snap.workspaces, running)
    return isinstance(find_placement(st, build_request(preemptor, st, CONFIG)), Found)


@pytest.mark.parametrize("seed", range(300))
def test_victims_are_minimal_and_a_single_victim_is_used_when_one_suffices(seed: int) -> None:
    snap = random_snapshot(seed, NOW)
    spaces = {w.name: w for w in snap.workspaces}
    for preemptor in snap.pending:
        space = spaces.get(preemptor.workspace)
        if space is None or space.quota_gpus is not None or space.quota_by_model:
            continue
        alone = Snapshot(snap.nodes, snap.workspaces, snap.running, [preemptor])
        victims = {p.victim for p in schedule(alone, CONFIG, NOW).preemptions}
        if not victims:
            continue
        assert _fits_without(snap, preemptor, victims)
        if len(victims) == 1:
            continue
        for v in victims:
            assert not _fits_without(snap, preemptor, victims - {v}), f"{v} not needed"
        st = ClusterState.from_snapshot(snap.nodes, snap.workspaces, snap.running)
        req = build_request(preemptor, st, CONFIG)
        for alloc in st.allocs.values():
            if alloc.kind == RUNNING and eligible(alloc, req, now=NOW, config=CONFIG, state=st):
                assert not _fits_without(snap, preemptor, {alloc.job.id}), "one would do"


# -- a virtual-time simulation: no thrash, no starvation of the highest class ----

def _simulate(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = rack("r1", 4) + rack("r2", 4) + rack("r3", 4, switch="s1")
    spaces = [Workspace("ws", queue_policy=rng.choice(["fifo", "balance"]))]
    dt, horizon = 10.0, 3000.0
    arrivals: list[tuple[float, Job, float]] = []
    for k in range(int(horizon / dt)):
        if rng.random() < 0.35:
            workers, per = rng.choice([(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)])
            prio = rng.choices(["low", "medium", "high"], [5, 3, 1])[0]
            arrivals.append((k * dt, job(f"j{k}", workers, per, prio=prio, at=k * dt,
                                         min_runtime_s=60), rng.uniform(50, 600)))
    runtime = {j.id: r for _, j, r in arrivals}
    arrived = {j.id: t for t, j, _ in arrivals}
    first_start: dict[str, float] = {}
    pending: dict[str, Job] = {}
    live: dict[str, Allocation] = {}
    left = dict(runtime)
    pairs: list[tuple[str, str]] = []
    now, i = 0.0, 0
    while now < 50_000 and (i < len(arrivals) or pending or live):
        while i < len(arrivals) and arrivals[i][0] <= now:
            pending[arrivals[i][1].id] = arrivals[i][1]
            i += 1
        for jid, alloc in list(live.items()):
            started = alloc.job.started_at or 0.0
            if alloc.terminating or now - started >= left[jid]:
                del live[jid]
        snap = Snapshot(nodes, spaces, list(live.values()), list(pending.values()))
        result = schedule(snap, CONFIG, now)
        check_cycle(snap, CONFIG, result)
        for p in result.preemptions:
            victim = live[p.victim]
            assert CONFIG.priorities[victim.job.priority] < \
                CONFIG.priorities[pending[p.preemptor].priority]
            assert now - (victim.job.started_at or 0.0) >= victim.job.min_runtime_s
            pairs.append((p.preemptor, p.victim))
            left[p.victim] -= now - (victim.job.started_at or 0.0)
            live[p.victim] = replace(victim, terminating=True)
            pending[p.victim] = p.requeue
        for jid, slots in result.placements.items():
            live[jid] = Allocation(replace(pending.pop(jid), started_at=now), slots)
            first_start.setdefault(jid, now)
        now += dt
    return {"arrivals": arrivals, "runtime": runtime, "arrived": arrived,
            "first_start": first_start, "pairs": pairs, "pending": pending}


@pytest.mark.parametrize("seed", range(12))
def test_simulation_never_thrashes_or_starves_the_highest_class(seed: int) -> None:
    sim = _simulate(seed)
    pairs = set(sim["pairs"])
    assert not any((b, a) in pairs for a, b in pairs), "preemption cycle"
    assert not sim["pending"], "queue did not drain"
    highs = [(t, j) for t, j, _ in sim["arrivals"] if j.priority == "high"]
    for t, j in highs:
        ahead = sum(sim["runtime"][h.id] for s, h in highs if s <= t and h.id != j.id)
        bound = ahead + 60 + 4 * 10.0
        wait = sim["first_start"][j.id] - t
        assert wait <= bound, f"high job {j.id} waited {wait:.0f}s (bound {bound:.0f}s)"


def test_simulation_preempts_at_all() -> None:
    assert any(_simulate(seed)["pairs"] for seed in range(12))
