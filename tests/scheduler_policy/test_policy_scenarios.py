"""Scheduling scenarios as data: nodes, jobs, config -> binds, evictions, reasons."""

from __future__ import annotations

import pytest
from policy_kit import NOW, Scenario, job, rack, racks_of, run, running

from services.scheduler.policy import Node, SchedulerConfig, Workspace

BALANCE = [Workspace("ws", queue_policy="balance")]
S: list[Scenario] = []

# -- gangs and topology -------------------------------------------------------

S.append(Scenario(
    "gang is all or nothing", rack("r1", 3), [job("big", 4)],
    pending_codes={"big": "capacity"},
    reasons={"big": "needs 32 GPUs (4 workers x 8 GPUs); 24 free on ready nodes"}))
S.append(Scenario(
    "gang goes to one rack when one rack holds it", rack("r1", 2) + rack("r2", 4) + rack("r3", 3),
    [job("g", 4)], placed={"g": {"r2"}}))
S.append(Scenario(
    "fewest racks, then the tightest rack for the remainder",
    rack("r1", 2) + rack("r2", 4) + rack("r3", 3), [job("g", 5)], placed={"g": {"r2", "r1"}}))
S.append(Scenario(
    "tightest single rack wins", rack("r1", 6) + rack("r2", 4), [job("g", 3)],
    placed={"g": {"r2"}}))
S.append(Scenario(
    "racks behind one switch before crossing switches",
    rack("r1", 3, switch="s0") + rack("r2", 3, switch="s1") + rack("r3", 2, switch="s0"),
    [job("g", 5)], placed={"g": {"r1", "r3"}}))
S.append(Scenario(
    "ranks follow numeric IP order inside a rack",
    [Node("a", 8, "MI300X", rack="r1", ip="10.0.1.9"), Node("b", 8, "MI300X", rack="r1",
     ip="10.0.1.10"), Node("c", 8, "MI300X", rack="r1", ip="10.0.1.2")],
    [job("g", 3)], placed={"g": ["c", "a", "b"]}))
S.append(Scenario(
    "a single worker takes the fullest node that holds it (best fit)", rack("r1", 3),
    [job("two", 1, 2, at=1), job("three", 1, 3, at=2)],
    running=[running(job("x", 1, 6, prio="high"), ["r1-n1"]),
             running(job("y", 1, 4, prio="high"), ["r1-n2"])],
    placed={"two": ["r1-n1"], "three": ["r1-n2"]}))
S.append(Scenario(
    "rack-scoped units never straddle racks", rack("r1", 6) + rack("r2", 6),
    [job("tp", 8, unit_workers=4, unit_scope="rack")], placed={"tp": {"r1", "r2"}}))
S.append(Scenario(
    "a rack-scoped unit that fits no rack waits, with the largest block",
    rack("r1", 3) + rack("r2", 3) + rack("r3", 3),
    [job("tp", 4, unit_workers=4, unit_scope="rack")],
    pending_codes={"tp": "capacity"},
    reasons={"tp": "needs 32 GPUs in one rack; largest free block is 24 in rack r1"}))
S.append(Scenario(
    "node-scoped units share a node", rack("r1", 3),
    [job("tp", 4, 2, unit_workers=2, unit_scope="node")],
    running=[running(job("x", 1, 6, prio="high"), ["r1-n0"]),
             running(job("y", 1, 6, prio="high"), ["r1-n1"])],
    placed={"tp": ["r1-n2"] * 4}))
_half_used = [running(job(f"x{i}", 1, 4), [f"r1-n{i}"]) for i in range(4)]
S.append(Scenario(
    "fragmented free GPUs are explained per node", rack("r1", 4),
    [job("two", 2, at=0), job("one", 1, at=1)], workspaces=BALANCE, running=_half_used,
    reasons={"two": "needs 2 workers x 8 GPUs, each worker on one node; the 16 free GPUs hold "
                    "only 0 such workers (at most 4 free on one node)",
             "one": "needs 8 GPUs on one node; at most 4 free on one node (8 free in total)"}))
S.append(Scenario(
    "GPU model constraint", rack("r1", 2, model="MI250X") + rack("r2", 2),
    [job("want300", 2, gpu_models={"MI300X"}), job("want-h100", 1, gpu_models={"H100"})],
    placed={"want300": {"r2"}}, pending_codes={"want-h100": "no-node"},
    reasons={"want-h100": "no ready node with GPU model H100"}))
S.append(Scenario(
    "only ready nodes are used",
    rack("r1", 1) + rack("r1", 1, state="quarantined", prefix="q")
    + rack("r1", 1, state="unready", prefix="u"),
    [job("two", 2, at=0), job("one", 1, at=1)], workspaces=BALANCE,
    placed={"one": ["r1-n0"]}, pending_codes={"two": "capacity"},
    reasons={"two": "needs 16 GPUs (2 workers x 8 GPUs); 0 free on ready nodes"}))
S.append(Scenario(
    "recovering jobs go first and avoid excluded nodes", rack("r1", 2),
    [job("high", prio="high", at=0), job("rec", at=5, recovering=True, exclude_nodes={"r1-n0"})],
    placed={"rec": ["r1-n1"], "high": ["r1-n0"]}))
S.append(Scenario(
    "preferred nodes are preferred", rack("r1", 4), [job("p", prefer_nodes={"r1-n2"})],
    placed={"p": ["r1-n2"]}))
S.append(Scenario(
    "a gang goes to the rack of its preferred nodes", rack("r1", 4) + rack("r2", 4),
    [job("p", 2, prefer_nodes={"r2-n3"})], placed={"p": ["r2-n0", "r2-n3"]}))

# -- quotas and queues ----------------------------------------------------------

S.append(Scenario(
    "workspace quota", rack("r1", 14), [job("more")],
    workspaces=[Workspace("ws", quota_gpus=100)],
    running=[running(job("x", 12, prio="high"), [f"r1-n{i}" for i in range(12)])],
    pending_codes={"more": "quota"},
    reasons={"more": "workspace quota: 96/100 GPUs used, needs 8"}))
S.append(Scenario(
    "per-model quota steers and blocks", rack("r1", 4, model="MI250X") + rack("r2", 4),
    [job("a", 1, at=1), job("b", 1, at=2), job("c", 1, at=3)],
    workspaces=[Workspace("ws", quota_by_model={"MI300X": 16}, queue_policy="balance")],
    placed={"a": {"r2"}, "b": {"r2"}}, pending_codes={"c": "quota"},
    reasons={"c": "workspace quota for MI300X: 16/16 GPUs used, needs 8"}))
S.append(Scenario(
    "FIFO stops at the first job that does not fit", rack("r1", 2),
    [job("big", 4, at=0), job("small", 1, at=1)],
    pending_codes={"big": "capacity", "small": "fifo"},
    reasons={"small": "behind big in the FIFO queue of workspace ws"},
    positions={"big": 1, "small": 2}))
S.append(Scenario(
    "balance backfills behind a head that cannot fit anywhere soon",
    rack("r1", 2), [job("big", 4, at=0), job("small", 1, at=1)], workspaces=BALANCE,
    placed={"small": ["r1-n0"]}, pending_codes={"big": "capacity"}, positions={"big": 1}))
_busy = [running(job("busy", 2, at=-1), ["r1-n0", "r1-n1"], started=NOW - 500)]
S.append(Scenario(
    "balance holds the head's capacity against backfill", rack("r1", 4) + rack("r2", 1),
    [job("big", 4, at=0), job("s1", 1, at=1), job("s2", 1, at=2)], workspaces=BALANCE,
    running=_busy, placed={"s1": ["r2-n0"]}, pending_codes={"big": "capacity", "s2": "held"},
    reasons={"big": "draining rack r1 for it (16 GPUs held now)", "s2": "held for big"}))
_estimated = [running(job("busy", 2, at=-1, expected_runtime_s=1000), ["r1-n0", "r1-n1"],
                      started=NOW - 500)]
S.append(Scenario(
    "a job that ends before the head can use them borrows held GPUs", rack("r1", 4),
    [job("big", 4, at=0), job("short", 1, at=1, expected_runtime_s=100),
     job("long", 1, at=2, expected_runtime_s=10_000)], workspaces=BALANCE, running=_estimated,
    placed={"short": {"r1"}}, pending_codes={"big": "capacity", "long": "held"},
    reasons={"big": "expected usable in 500s"}))

_two_used = [running(job("x", 1, 2, preemptible=False), ["r1-n0"]),
             running(job("y", 1, 2, preemptible=False), ["r1-n1"])]
S.append(Scenario(
    "best fit tops up the first partly used node", rack("r1", 2),
    [job("big", 1, 8), job("small", 1, 2, prio="high")], running=_two_used,
    placed={"small": ["r1-n0"]}, reserved={"big": {"r1-n1"}}))
S.append(Scenario(
    "jobs ahead of a blocked job steer clear of the node drained for it", rack("r1", 2),
    [job("big", 1, 8), job("small", 1, 2, prio="high")], running=_two_used,
    carried={"big": ["r1-n0"]}, placed={"small": ["r1-n1"]}, reserved={"big": {"r1-n0"}}))
S.append(Scenario(
    "a reservation names the nodes to drain even before any GPU is free", rack("r1", 2),
    [job("big", 1, 8)], running=[running(job("x", 1, 8, preemptible=False), ["r1-n0"]),
                                 running(job("y", 1, 8, preemptible=False), ["r1-n1"])],
    reserved={"big": {"r1-n0"}}, reasons={"big": "draining rack r1 for it (0 GPUs held now)"}))
S.append(Scenario(
    "a partly used node before an empty one of the same free size",
    rack("r1", 1, gpus=2, prefix="t4") + rack("r2", 1),
    [job("one", 1, 1)], running=[running(job("x", 1, 6, preemptible=False), ["r2-n0"])],
    placed={"one": ["r2-n0"]}))

# -- preemption -------------------------------------------------------------------

S.append(Scenario(
    "high preempts the low job that loses least", rack("r1", 2), [job("h", prio="high")],
    running=[running(job("old", prio="low"), ["r1-n0"], started=NOW - 1000),
             running(job("new", prio="low"), ["r1-n1"], started=NOW - 100)],
    preempted={("new", "h")}, pending_codes={"h": "preempting"}, nominated={"h": {"r1-n1"}},
    reasons={"h": "preempting new"}))
S.append(Scenario(
    "fewest victims before cheapest", rack("r1", 4), [job("h", 2, prio="high")],
    running=[running(job("a", 2, prio="low"), ["r1-n0", "r1-n1"], started=NOW - 5000),
             running(job("b", prio="low"), ["r1-n2"], started=NOW - 10),
             running(job("c", prio="low"), ["r1-n3"], started=NOW - 10)],
    preempted={("a", "h")}))
S.append(Scenario(
    "lowest priority class is preempted first", rack("r1", 2), [job("h", prio="high")],
    running=[running(job("m", prio="medium"), ["r1-n0"], started=NOW - 10),
             running(job("l", prio="low"), ["r1-n1"], started=NOW - 5000)],
    preempted={("l", "h")}))
S.append(Scenario(
    "never non-preemptible, too young, or not lower priority", rack("r1", 3),
    [job("h", prio="high")],
    running=[running(job("pinned", prio="low", preemptible=False), ["r1-n0"], started=0),
             running(job("young", prio="low", min_runtime_s=600), ["r1-n1"], started=NOW - 10),
             running(job("peer", prio="high"), ["r1-n2"], started=0)],
    preempted=set(), pending_codes={"h": "capacity"}))
S.append(Scenario(
    "the lowest class preempts nobody", rack("r1", 1), [job("l2", prio="low", at=5)],
    running=[running(job("l1", prio="low"), ["r1-n0"], started=0)], preempted=set()))
S.append(Scenario(
    "a workspace with preemption off does not preempt", rack("r1", 1), [job("h", prio="high")],
    workspaces=[Workspace("ws", preemption=False)],
    running=[running(job("l", prio="low"), ["r1-n0"], started=0)], preempted=set()))
_other = [running(job("l", prio="low", ws="other"), ["r1-n0"], started=0)]
S.append(Scenario(
    "no preemption across workspaces by default", rack("r1", 1), [job("h", prio="high")],
    workspaces=[Workspace("ws"), Workspace("other")], running=_other, preempted=set()))
S.append(Scenario(
    "preemption across workspaces when configured", rack("r1", 1), [job("h", prio="high")],
    workspaces=[Workspace("ws"), Workspace("other")], running=_other,
    config=SchedulerConfig(cross_workspace_preemption=True), preempted={("l", "h")}))
S.append(Scenario(
    "preemption frees workspace quota", rack("r1", 4), [job("h", 2, prio="high")],
    workspaces=[Workspace("ws", quota_gpus=16)],
    running=[running(job("l", 2, prio="low"), ["r1-n0", "r1-n1"], started=0)],
    preempted={("l", "h")}))
_gang = [running(job("gang", 1, 8, prio="low"), ["r1-n0"], started=0)]
S.append(Scenario(
    # Its GPUs would go to other small jobs, and the gang would wait for a
    # whole node again (the Alibaba trace replay's 8-GPU waits doubled).
    "a job never preempts a job larger than itself", rack("r1", 1), [job("h", 1, 1, prio="high")],
    running=_gang, preempted=set(), pending_codes={"h": "capacity"}))
S.append(Scenario(
    "unless configured to", rack("r1", 1), [job("h", 1, 1, prio="high")], running=_gang,
    config=SchedulerConfig(preempt_larger_jobs=True), preempted={("gang", "h")}))
S.append(Scenario(
    "a larger victim only when no smaller one will do", rack("r1", 2),
    [job("h", 1, 1, prio="high")],
    config=SchedulerConfig(preempt_larger_jobs=True),
    running=[running(job("gang", 1, 8, prio="low"), ["r1-n0"], started=NOW - 10),
             running(job("small", 1, 1, prio="low"), [("r1-n1", 1)], started=NOW - 5000),
             running(job("fill", 1, 7, prio="high"), [("r1-n1", 7)], started=0)],
    preempted={("small", "h")}))
S.append(Scenario(
    "a job placed onto GPUs being released waits and evicts nobody else", rack("r1", 2),
    [job("h", prio="high")],
    running=[running(job("going", prio="low"), ["r1-n0"], started=0, terminating=True),
             running(job("stay", prio="low"), ["r1-n1"], started=0)],
    preempted=set(), pending_codes={"h": "waiting"}, nominated={"h": {"r1-n0"}},
    reasons={"h": "waiting for preempted going"}))

# -- what the Alibaba trace replay found (bench/scheduler_trace.py) ---------------

S.append(Scenario(
    # Tightest-node packing put it on the 2-GPU T4 node, where the jobs pinned
    # to T4 then had to wait; nothing is pinned to G2.
    "a job that may run anywhere stays off the GPU model pinned jobs need",
    rack("r1", 1, gpus=2, model="T4") + rack("r2", 1, model="G2"),
    [job("any", 1, 1, at=0), job("t4b", 1, 1, at=1, gpu_models={"T4"})],
    running=[running(job("t4", 1, 1, gpu_models={"T4"}), ["r1-n0"]),
             running(job("g", 1, 6), ["r2-n0"])],
    placed={"any": ["r2-n0"], "t4b": ["r1-n0"]}))
S.append(Scenario(
    # The T4 rack is the tighter fit, but a job pinned to T4 needs it.
    "a gang that may run anywhere stays off the GPU model pinned jobs need",
    rack("r1", 3, model="T4") + rack("r2", 3, model="G2"), [job("g", 2)],
    running=[running(job("t4", 1, 8, gpu_models={"T4"}), ["r1-n0"])],
    placed={"g": {"r2"}}))
S.append(Scenario(
    # Tightest first puts "one" on n0 (2 free), then a 2-GPU job on n1 and
    # the other 2-GPU job finds 1 + 1 free GPUs.
    "a single worker leaves free GPUs that the queued shapes can use", rack("r1", 2),
    [job("one", 1, 1, at=0), job("two", 1, 2, at=1), job("two-b", 1, 2, at=2)],
    workspaces=BALANCE,
    running=[running(job("x", 1, 6, prio="high"), ["r1-n0"]),
             running(job("y", 1, 5, prio="high"), ["r1-n1"])],
    placed={"one": ["r1-n1"], "two": ["r1-n0"], "two-b": ["r1-n1"]}))
S.append(Scenario(
    # A FIFO queue, so that the jobs are placed one by one in their order (a
    # balance queue starts the 2-GPU jobs first where two GPUs are free).
    "tightest node when fragmentation-aware placement is off", rack("r1", 2),
    [job("one", 1, 1, at=0), job("two", 1, 2, at=1), job("two-b", 1, 2, at=2)],
    config=SchedulerConfig(fragmentation_aware=False),
    running=[running(job("x", 1, 6, prio="high"), ["r1-n0"]),
             running(job("y", 1, 5, prio="high"), ["r1-n1"])],
    placed={"one": ["r1-n0"], "two": ["r1-n1"]}, pending_codes={"two-b": "capacity"}))
S.append(Scenario(
    # The node with the most free GPUs holds a job that has run for a day;
    # the other's job started a minute ago. Run times are heavy-tailed.
    "a blocked head drains the node expected to empty soonest", rack("r1", 2),
    [job("big", 1, 8)],
    running=[running(job("old", 1, 2, prio="high"), ["r1-n0"], started=NOW - 86_400),
             running(job("young", 1, 4, prio="high"), ["r1-n1"], started=NOW - 60)],
    pending_codes={"big": "capacity"}, reserved={"big": {"r1-n1"}}))
S.append(Scenario(
    # Letting the high-priority job that can use any GPU take it would start
    # the drain over, every time: the gang would never start.
    "a drained node goes to the job it was drained for", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=0)], workspaces=BALANCE,
    running=[running(job("busy", 1, 8, prio="high"), ["r1-n0"])],
    carried={"big": ["r1-n1"]}, placed={"big": ["r1-n1"]}, pending_codes={"h": "capacity"}))
S.append(Scenario(
    "FIFO blocks only the jobs that compete for the blocked job's GPU models",
    rack("r1", 1, model="MI250X") + rack("r2", 1),
    [job("a", gpu_models={"MI300X"}, at=0), job("b", gpu_models={"MI250X"}, at=1),
     job("c", at=2)],
    running=[running(job("busy", prio="high"), ["r2-n0"])],
    placed={"b": ["r1-n0"]}, pending_codes={"a": "capacity", "c": "fifo"},
    reasons={"c": "behind a in the FIFO queue of workspace ws"}))

# -- ordering, invalid jobs, positions -------------------------------------------------

S.append(Scenario(
    "invalid jobs get precise reasons and do not block FIFO", rack("r1", 2),
    [job("nows", ws="nope", at=0), job("noprio", prio="urgent", at=0),
     job("units", 3, unit_workers=2, at=0), job("fat", 1, 16, at=0),
     job("fatunit", 2, 8, unit_workers=2, at=0), job("ok", 1, at=9)],
    placed={"ok": {"r1"}},
    reasons={"nows": "unknown workspace 'nope'", "noprio": "unknown priority class 'urgent'",
             "units": "workers (3) is not a multiple of unit_workers (2)",
             "fat": "a worker of 16 GPUs needs 16 GPUs on one node; the largest ready node",
             "fatunit": "a unit of 2 workers x 8 GPUs needs 16 GPUs on one node"}))
S.append(Scenario(
    "a job bigger than its whole quota is invalid, not a queue blocker", rack("r1", 4),
    [job("huge", 3, at=0), job("ok", 1, at=1)], workspaces=[Workspace("ws", quota_gpus=16)],
    placed={"ok": {"r1"}}, pending_codes={"huge": "invalid"},
    reasons={"huge": "workspace ws's whole quota is 16"}))
S.append(Scenario(
    "positions count per workspace", rack("r1", 1),
    [job("a1", 2, ws="a", at=0), job("b1", 2, ws="b", at=1), job("a2", ws="a", at=2),
     job("b2", ws="b", at=3)],
    workspaces=[Workspace("a"), Workspace("b")],
    positions={"a1": 1, "a2": 2, "b1": 1, "b2": 2}))


@pytest.mark.parametrize("s", S, ids=[s.name for s in S])
def test_scenario(s: Scenario) -> None:
    result = run(s)
    for job_id, want in s.placed.items():
        assert job_id in result.placements, f"{job_id} not placed: {result.pending.get(job_id)}"
        nodes = [n for n, _ in result.placements[job_id]]
        if isinstance(want, set):
            assert racks_of(s.nodes, nodes) == want
        else:
            assert nodes == want
    for job_id, code in s.pending_codes.items():
        assert job_id in result.pending, f"{job_id} was placed"
        assert result.pending[job_id].code == code, result.pending[job_id]
    for job_id, text in s.reasons.items():
        assert text in result.pending[job_id].reason, result.pending[job_id].reason
    if s.preempted is not None:
        assert {(p.victim, p.preemptor) for p in result.preemptions} == s.preempted
    for job_id, nodes in s.nominated.items():
        assert {n for n, _ in result.nominations[job_id]} == nodes
    for job_id, position in s.positions.items():
        assert result.pending[job_id].position == position
    if s.reserved is not None:
        assert {k: set(v) for k, v in result.reservations.items()} == s.reserved


def test_queue_order_breaks_ties_the_same_way() -> None:
    jobs = [job("m-late", at=5), job("m-b", at=1), job("m-a", at=1), job("h", prio="high", at=9),
            job("m-pre", at=7, preempted=True), job("rec", prio="low", at=8, recovering=True)]
    s = Scenario("order", rack("r1", 1), jobs)
    assert run(s).order == ("rec", "h", "m-pre", "m-a", "m-b", "m-late")
    assert run(Scenario("order", rack("r1", 1), jobs[::-1])).order == run(s).order


def test_victims_are_requeued_at_the_head_with_their_retry_budget() -> None:
    victim = job("v", prio="low", retries=2, max_retry=3)
    s = Scenario("requeue", rack("r1", 1), [job("h", prio="high")],
                 running=[running(victim, ["r1-n0"], started=0)])
    (p,) = run(s).preemptions
    assert (p.victim, p.preemptor) == ("v", "h")
    assert p.requeue.retries == 2 and p.requeue.max_retry == 3
    assert p.requeue.preempted and p.requeue.started_at is None
    later = job("l-early", prio="low", at=-100)
    assert run(Scenario("head", rack("r1", 0), [later, p.requeue])).order[0] == "v"
