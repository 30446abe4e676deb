"""Causes found by replaying the Alibaba GPU traces (``bench/scheduler_trace.py``)
against FIFO first-fit and best-fit, each as a scenario: nodes, jobs -> binds
and holds. Each failed before its fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from policy_kit import NOW, Scenario, job, rack, run, running

from libs.specs import SpecError
from services.scheduler.config import load
from services.scheduler.policy import SchedulerConfig, Workspace

BALANCE = [Workspace("ws", queue_policy="balance")]
S: list[Scenario] = []

_one_full = [running(job("busy", 1, 8, prio="high", preemptible=False), ["r1-n0"])]
S.append(Scenario(
    # Decided by priority alone, the 1-GPU job took the only wholly free
    # node (stranding 7 GPUs) and the gang waited for another to drain; on
    # the trace replays 8-GPU tasks waited up to twice as long as under FIFO
    # first-fit, and more free GPUs sat on partly used nodes. The 1-GPU job
    # takes the next GPU that frees up anywhere instead.
    "a gang that needs whole nodes takes a wholly free node before smaller jobs",
    rack("r1", 2), [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)],
    workspaces=BALANCE, running=_one_full,
    placed={"big": ["r1-n1"]}, pending_codes={"h": "capacity"}))
S.append(Scenario(
    "a smaller job still tops up a partly used node next to it", rack("r1", 3),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)], workspaces=BALANCE,
    running=[*_one_full, running(job("part", 1, 4, prio="high"), ["r1-n2"])],
    placed={"big": ["r1-n1"], "h": ["r1-n2"]}))
S.append(Scenario(
    "a FIFO queue keeps its order", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)], running=_one_full,
    placed={"h": ["r1-n1"]}, pending_codes={"big": "capacity"}))
S.append(Scenario(
    "a gang that must share free nodes with a smaller job does not jump it", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 4, at=1)], workspaces=BALANCE,
    running=_one_full, placed={"h": ["r1-n1"], "big": ["r1-n1"]}))

# Both nodes busy; "b" started a minute ago, so its node is expected to
# drain first.
_both_full = [running(job("a", 1, 8, prio="high", preemptible=False), ["r1-n0"],
                      started=NOW - 600),
              running(job("b", 1, 8, prio="high", preemptible=False), ["r1-n1"],
                      started=NOW - 60)]
S.append(Scenario(
    # A queue holds capacity for one blocked job, and it went to the first in
    # queue order: with high priority first, mostly a one-GPU job, which
    # takes the next GPU that frees anywhere without help. The 8-GPU tasks
    # behind it had nothing held, and each waited for a node to empty by
    # chance while one-GPU jobs took every GPU that freed (default trace at
    # load 1: 243 s mean wait against first-fit's 163 s).
    "a job that needs a whole node holds the next to drain, not a smaller job ahead",
    rack("r1", 2), [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)],
    workspaces=BALANCE, running=_both_full,
    pending_codes={"h": "capacity", "big": "capacity"}, reserved={"big": {"r1-n1"}}))
S.append(Scenario(
    "a FIFO queue holds capacity for its head", rack("r1", 2),
    [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)], running=_both_full,
    pending_codes={"h": "capacity", "big": "fifo"}, reserved={"h": {"r1-n1"}}))
S.append(Scenario(
    # The hold was taken before the jobs ahead were decided; when its turn
    # comes the job is decided afresh and, preempting, holds nothing.
    "a whole-node job that preempts in its turn gives back the hold it took",
    rack("r1", 2), [job("h", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)],
    workspaces=BALANCE,
    running=[running(job("a", 1, 8, prio="high", preemptible=False), ["r1-n0"],
                     started=NOW - 600),
             running(job("low", 1, 8, prio="low"), ["r1-n1"], started=NOW - 60)],
    pending_codes={"big": "preempting"}, reserved={}))

# Three busy nodes, expected to drain in the order n2, n1, n0.
_three_full = [running(job(n, 1, 8, prio="high", preemptible=False), [f"r1-{n}"],
                       started=NOW - t) for n, t in (("n0", 600), ("n1", 300), ("n2", 60))]
_three_queued = [job("h", 1, 1, prio="high", at=0), job("big1", 1, 8, at=1),
                 job("big2", 1, 8, at=2), job("big3", 1, 8, at=3)]
S.append(Scenario(
    # With one hold per queue, the second 8-GPU job waited for a node to
    # empty by chance, while one-GPU jobs took the GPUs of each node that
    # started to drain. Two held nodes drain at once; over the Alibaba trace
    # replays the stranded share while tasks queue fell further, and 8-GPU
    # waits with it (gpuspec33 at load 4: 689 s to 470 s).
    "two whole-node jobs of a queue each hold a node to drain, a third waits",
    rack("r1", 3), _three_queued, workspaces=BALANCE, running=_three_full,
    pending_codes={"h": "capacity", "big1": "capacity", "big2": "capacity",
                   "big3": "capacity"},
    reserved={"big1": {"r1-n2"}, "big2": {"r1-n1"}}))
S.append(Scenario(
    "with whole_node_holds 0 the first blocked job of a queue holds capacity",
    rack("r1", 3), _three_queued, workspaces=BALANCE, running=_three_full,
    config=SchedulerConfig(whole_node_holds=0), reserved={"h": {"r1-n2"}}))
S.append(Scenario(
    "whole-node holds count against max_reservations",
    rack("r1", 3), _three_queued, workspaces=BALANCE, running=_three_full,
    config=SchedulerConfig(max_reservations=1), reserved={"big1": {"r1-n2"}}))

# Four GPUs free on r1-n0, none on r1-n1; four one-GPU jobs of high
# priority and a 4-GPU job of low priority queue.
_half_used = [running(job("part", 1, 4, prio="high", preemptible=False), ["r1-n0"]),
              running(job("full", 1, 8, prio="high", preemptible=False), ["r1-n1"])]
_ones_then_four = [*(job(f"h{i}", 1, 1, prio="high", at=i) for i in range(4)),
                   job("q4", 1, 4, prio="low", at=4)]
S.append(Scenario(
    # By priority alone the one-GPU jobs took the four GPUs, as every GPU
    # that freed, and the 4-GPU job waited for the stream to end, then for
    # the holes it left to merge: replaying multigpu30 at load 1, 134 GPUs
    # sat free on average while a 4-GPU job was the smallest one waiting,
    # and allocation while tasks queued was 0.992 against first-fit's 0.999.
    "a job of several GPUs takes that many freed together before one-GPU jobs",
    rack("r1", 2), _ones_then_four, workspaces=BALANCE, running=_half_used,
    placed={"q4": ["r1-n0"]}, pending_codes={f"h{i}": "capacity" for i in range(4)}))
S.append(Scenario(
    "in a FIFO queue the one-GPU jobs keep their turn", rack("r1", 2), _ones_then_four,
    running=_half_used, placed={f"h{i}": ["r1-n0"] for i in range(4)},
    pending_codes={"q4": "capacity"}))
S.append(Scenario(
    "a job of several GPUs does not open an empty node ahead of one-GPU jobs",
    rack("r1", 2), [*(job(f"h{i}", 1, 1, prio="high", at=i) for i in range(8)),
                    job("q4", 1, 4, prio="low", at=8)],
    workspaces=BALANCE,
    running=[running(job("full", 1, 8, prio="high", preemptible=False), ["r1-n0"])],
    placed={f"h{i}": ["r1-n1"] for i in range(8)}, pending_codes={"q4": "capacity"}))
S.append(Scenario(
    # "big" held r1-n0 last cycle and holds nothing ahead of its turn (no
    # whole-node holds): the 2-GPU job does not take the GPUs it drained.
    "a job of several GPUs does not take GPUs drained for a blocked job",
    rack("r1", 2), [job("big", 1, 8, prio="high", at=0), job("q2", 1, 2, prio="low", at=1)],
    workspaces=BALANCE, config=SchedulerConfig(whole_node_holds=0),
    running=[running(job("part", 1, 6, prio="high", preemptible=False), ["r1-n0"]),
             running(job("full", 1, 8, prio="high", preemptible=False), ["r1-n1"])],
    carried={"big": ["r1-n0"]}, pending_codes={"big": "capacity", "q2": "held"},
    reserved={"big": {"r1-n0"}}))

S.append(Scenario(
    # By pressure alone (GPUs pinned jobs ask per GPU of the model) the
    # flexible job took the empty G2 node, nothing being pinned to G2, while
    # the T4 GPUs its pinned jobs leave sat idle. On the gpuspec20 replay at
    # load 1 flexible jobs filled every G2 node that way while half of T4
    # stayed free, and 8-GPU tasks waited 281 s against first-fit's 165 s.
    "a job that may run anywhere takes idle GPUs of a pinned model before the last empty node",
    rack("r1", 4, gpus=2, model="T4") + rack("r2", 3, model="G2"),
    [job("any", 1, 1, prio="high", at=0), job("big", 1, 8, at=1)],
    running=[running(job("t0", 1, 2, gpu_models={"T4"}), ["r1-n0"]),
             running(job("t1", 1, 2, gpu_models={"T4"}), ["r1-n1"]),
             running(job("g0", 1, 8), ["r2-n0"]), running(job("g1", 1, 8), ["r2-n1"])],
    placed={"any": ["r1-n2"], "big": ["r2-n2"]}))

S.append(Scenario(
    # "big3" may run only on G3 and waits for r3-n0, whose job is expected
    # to end first. By pull alone, G3 (half asked for by pinned jobs) came
    # before G2 (more of it in use) and the flexible job took a GPU of
    # r3-n1, so neither G3 node could empty. On the gpuspec25 replays one
    # G3-pinned 8-GPU task waited 17,339 s against first-fit's 7,001 s while
    # flexible tasks kept landing on G3. A model a pinned job waits for is a
    # flexible job's last choice.
    "a job that may run anywhere stays off a GPU model a pinned job waits for",
    rack("r2", 2, model="G2") + rack("r3", 2, model="G3"),
    [job("big3", 1, 8, at=0, gpu_models={"G3"}), job("any", 1, 1, prio="high", at=1)],
    workspaces=BALANCE,
    running=[running(job("long", 1, 8), ["r3-n0"], started=NOW - 3600),
             running(job("old", 1, 1), ["r3-n1"], started=NOW - 36000),
             running(job("g6", 1, 6), ["r2-n0"]), running(job("g4", 1, 4), ["r2-n1"])],
    carried={"big3": ["r3-n0"]}, placed={"any": ["r2-n0"]},
    pending_codes={"big3": "capacity"}, reserved={"big3": {"r3-n0"}}))
S.append(Scenario(
    # A pinned job that needs part of a node finds it as any of its
    # model's jobs end, so its model keeps its usual place. Keeping jobs
    # that may run anywhere off every model a pinned job waits on crowded
    # the others: 668 of 693 goals over the replays against 671.
    "a pinned job that needs part of a node does not keep others off its model",
    rack("r2", 2, model="G2") + rack("r3", 2, model="G3"),
    [job("part3", 1, 4, at=0, gpu_models={"G3"}), job("any", 1, 1, prio="high", at=1)],
    workspaces=BALANCE,
    running=[running(job("long", 1, 8), ["r3-n0"], started=NOW - 3600),
             running(job("five", 1, 5), ["r3-n1"], started=NOW - 36000),
             running(job("g7", 1, 7), ["r2-n0"]), running(job("g6", 1, 6), ["r2-n1"])],
    carried={"part3": ["r3-n0"]}, placed={"any": ["r3-n1"]},
    pending_codes={"part3": "capacity"}))

S.append(Scenario(
    # "big" claimed the four free GPUs of r1-n0 (drained soonest), so "h1"
    # found only two GPUs on each of two nodes and the cycle remembered
    # that its shape does not fit. In its turn "big" gave the claim back and
    # waits for the GPUs being released on r0-n0; "h2", of h1's shape,
    # takes the four GPUs given back rather than failing from memory.
    "a job of a shape that failed under a claim fits once the claim is given back",
    rack("r0", 1, model="Y") + rack("r1", 3),
    [job("h1", 1, 4, prio="high", at=0, gpu_models={"MI300X"}), job("big", 1, 8, at=1),
     job("h2", 1, 4, at=2, gpu_models={"MI300X"})],
    workspaces=BALANCE,
    running=[running(job("going", 1, 8, prio="low"), ["r0-n0"], started=0,
                     terminating=True),
             running(job("b", 1, 4, prio="high", preemptible=False), ["r1-n0"],
                     started=NOW - 60),
             running(job("c", 1, 6, prio="high", preemptible=False), ["r1-n1"],
                     started=NOW - 3_600),
             running(job("d", 1, 6, prio="high", preemptible=False), ["r1-n2"],
                     started=NOW - 3_600)],
    placed={"h2": ["r1-n0"]}, pending_codes={"h1": "held", "big": "waiting"}))

S.append(Scenario(
    # A one-node head waited on the node expected to drain wholly soonest.
    # On the default trace a stream of short high-priority 4-GPU tasks held
    # each 8-GPU node as it emptied, a pair at a time, and the medium 8-GPU
    # tasks queued behind them each waited for another node (254 s on
    # average, against 163 s under FIFO first-fit). A 4-GPU head now waits
    # where four GPUs free up soonest: next to a job about to end, even if
    # the node's other job runs for a day.
    "a one-node head waits where its GPUs free up first, not the whole node",
    rack("r1", 2), [job("h4", 1, 4, prio="high", at=0)],
    running=[running(job("long", 1, 4, preemptible=False), ["r1-n0"], started=0.0),
             running(job("short", 1, 4, preemptible=False), ["r1-n0"], started=NOW - 60),
             running(job("whole", 1, 8, preemptible=False), ["r1-n1"], started=NOW - 3_600)],
    pending_codes={"h4": "capacity"}, reserved={"h4": {"r1-n0"}}))
S.append(Scenario(
    "with nothing about to end on any node, the one to drain first is held",
    rack("r1", 2), [job("h4", 1, 4, prio="high", at=0)],
    running=[running(job("long", 1, 4, preemptible=False), ["r1-n0"], started=0.0),
             running(job("mid", 1, 4, preemptible=False), ["r1-n0"], started=NOW - 7_200),
             running(job("whole", 1, 8, preemptible=False), ["r1-n1"], started=NOW - 3_600)],
    pending_codes={"h4": "capacity"}, reserved={"h4": {"r1-n1"}}))

# The head needs four GPUs: the two free and the two "soon" frees in 100 s.
# "late" runs for hours, so the head's hold was said to last until then, and
# a 2-GPU job due to run 1,000 s borrowed the free pair and delayed the head
# by 900 s. Only jobs gone before "soon" ends may borrow now.
_soon_and_late = [
    running(job("soon", 1, 2, preemptible=False, expected_runtime_s=200), ["r1-n0"],
            started=NOW - 100),
    running(job("late", 1, 4, preemptible=False, expected_runtime_s=20_000), ["r1-n0"],
            started=NOW - 100)]
S.append(Scenario(
    "a job that would outlast the GPUs the head waits for does not borrow its hold",
    rack("r1", 1), [job("h4", 1, 4, prio="high", at=0),
                    job("fill", 1, 2, at=1, expected_runtime_s=1_000)],
    workspaces=BALANCE, running=_soon_and_late,
    pending_codes={"h4": "capacity", "fill": "held"}, reserved={"h4": {"r1-n0"}}))
S.append(Scenario(
    "a job gone before them still borrows it", rack("r1", 1),
    [job("h4", 1, 4, prio="high", at=0), job("fill", 1, 2, at=1, expected_runtime_s=50)],
    workspaces=BALANCE, running=_soon_and_late,
    placed={"fill": ["r1-n0"]}, pending_codes={"h4": "capacity"}))


# One GPU model in two node sizes, as the trace's V100M16 (1, 4 and 8 GPUs)
# and T4 (2 and 4). The counters took a node for wholly free only when it
# had as many free GPUs as the model's largest node, so an empty 4-GPU node
# ranked as a partly used one beside 8-GPU nodes and, first in topology
# order, took the job: a new partly used node, and the 4-GPU jobs lost a
# whole node.
_two_sizes = [*rack("r1", 1, gpus=4, prefix="small"), *rack("r1", 1, gpus=8, first=2, prefix="big")]
S.append(Scenario(
    "a one-GPU job tops up a partly used node before an empty smaller one",
    _two_sizes, [job("one", 1, 1)],
    running=[running(job("half", 1, 4, preemptible=False), ["big-n0"])],
    placed={"one": ["big-n0"]}))

# A one-node head waits where its GPUs are expected to free up soonest, and
# a job is expected to run as long again as it has run. The node being
# drained keeps its jobs while they age, so it looks later every cycle,
# while a node that has just taken young jobs looks soon: the hold followed
# young jobs from node to node (replaying the default trace, 12 times in
# 270 held cycles; 5 now) and gave away what the held node had freed. It moves
# only to a node expected in under half the time the held one still needs.
_aged = [running(job("old", 1, 8, preemptible=False), ["r1-n0"], started=NOW - 1_000),
         running(job("young", 1, 8, preemptible=False), ["r1-n1"], started=NOW - 700)]
S.append(Scenario(
    "with nothing held, the head waits on the node expected to free up first",
    rack("r1", 2), [job("big", 1, 8, at=1)], running=_aged,
    pending_codes={"big": "capacity"}, reserved={"big": {"r1-n1"}}))
S.append(Scenario(
    "a head keeps the node it held unless another is expected in under half the time",
    rack("r1", 2), [job("big", 1, 8, at=1)], running=_aged, carried={"big": ["r1-n0"]},
    pending_codes={"big": "capacity"}, reserved={"big": {"r1-n0"}}))
S.append(Scenario(
    "a head leaves the node it held for one expected in under half the time",
    rack("r1", 2), [job("big", 1, 8, at=1)],
    running=[_aged[0], running(job("fresh", 1, 8, preemptible=False), ["r1-n1"],
                               started=NOW - 400)],
    carried={"big": ["r1-n0"]}, pending_codes={"big": "capacity"},
    reserved={"big": {"r1-n1"}}))

_three = [*_aged, running(job("newer", 1, 8, preemptible=False), ["r1-n2"], started=NOW - 600)]
S.append(Scenario(
    "a gang waits on the nodes of its rack expected to drain first",
    rack("r1", 3), [job("gang", 2, 8, at=1)], running=_three,
    pending_codes={"gang": "capacity"}, reserved={"gang": {"r1-n1", "r1-n2"}}))
S.append(Scenario(
    "a gang keeps the nodes it held unless others drain in under half the time",
    rack("r1", 3), [job("gang", 2, 8, at=1)], running=_three,
    carried={"gang": ["r1-n0", "r1-n1"]}, pending_codes={"gang": "capacity"},
    reserved={"gang": {"r1-n0", "r1-n1"}}))

@pytest.mark.parametrize("s", S, ids=[s.name for s in S])
def test_scenario(s: Scenario) -> None:
    result = run(s)
    for job_id, want in s.placed.items():
        assert job_id in result.placements, f"{job_id} not placed: {result.pending.get(job_id)}"
        assert [n for n, _ in result.placements[job_id]] == want
    for job_id, code in s.pending_codes.items():
        assert job_id in result.pending, f"{job_id} was placed"
        assert result.pending[job_id].code == code, result.pending[job_id]
    if s.reserved is not None:
        assert {k: set(v) for k, v in result.reservations.items()} == s.reserved


def test_a_victim_search_out_of_budget_evicts_only_what_the_placement_needs() -> None:
    # Replaying the multigpu50 trace, one 4-GPU job evicted 44 one-GPU jobs:
    # the search ran out of fit checks while releasing victims, went on
    # releasing every candidate, and had no checks left to spare the ones not
    # needed.
    nodes = rack("r1", 6)
    small = [running(job(f"s{k}-{slot}", 1, 1, prio="low"), [(f"r1-n{k}", 1)],
                     started=float(slot * 6 + k))  # most recent first: across the nodes
             for k in range(6) for slot in range(8)]
    s = Scenario("out of budget", nodes, [job("big", 1, 4, prio="high", at=1)],
                 running=small, config=replace(SchedulerConfig(), max_victim_checks=4))
    result = run(s)
    node_of = {a.job.id: a.slots[0][0] for a in small}
    victims = [p.victim for p in result.preemptions if p.preemptor == "big"]
    assert len(victims) == 4
    assert len({node_of[v] for v in victims}) == 1  # all on the node it will take
    (node, gpus), = result.nominations["big"]
    assert gpus == 4 and {node_of[v] for v in victims} == {node}


def test_the_scheduler_file_sets_whole_node_holds(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text("whole_node_holds: 0\n")
    assert load(path).policy().whole_node_holds == 0
    assert load(None).policy().whole_node_holds == SchedulerConfig().whole_node_holds == 2
    path.write_text("whole_node_holds: -1\n")
    with pytest.raises(SpecError, match=r"field 'whole_node_holds': .* greater than or equal to 0"):
        load(path)
