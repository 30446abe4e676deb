"""The agent's placement bookkeeping (services/bench/placements.py): which
job, attempt and rank holds each GPU of its node, from the scheduler's
facts, whatever order and however often they come. Scenarios as data:
facts in, the owner of each GPU out."""

from __future__ import annotations

import time
from typing import Any

import pytest

from libs.events import GpuMetrics, JobSpec, NodeTelemetryData, WorkerSlot
from libs.records import JobRecord
from services.bench.placements import REMEMBERED, Owner, Placements, attributed

NODE = "n1"
EIGHT = list(range(8))


def slots(*spec: tuple[int, str, int]) -> list[WorkerSlot]:
    """(rank, node, gpus) each."""
    return [WorkerSlot(rank=r, node=n, gpus=g) for r, n, g in spec]


def apply(p: Placements, facts: list[tuple[Any, ...]], devices: list[int] = EIGHT
          ) -> dict[int, tuple[str, int, int]]:
    """Feed facts; telemetry is read after each (``("see",)`` marks where
    the GPUs were seen, which fixes who holds which device)."""
    for fact in facts:
        kind, *args = fact
        if kind == "placed":
            p.placed(*args)
        elif kind == "exited":
            p.exited(*args)
        elif kind == "ended":
            p.ended(*args)
        else:
            assert kind == "see"
            p.owners(devices)
    return {d: (o.job, o.attempt, o.rank) for d, o in p.owners(devices).items()}


WHOLE = slots((0, NODE, 8), (1, "n2", 8))
HALF = slots((0, NODE, 4))
SCENARIOS: list[tuple[str, list[tuple[Any, ...]], dict[int, tuple[str, int, int]]]] = [
    ("a worker with the whole node holds every GPU",
     [("placed", "a", 1, WHOLE)], {d: ("a", 1, 0) for d in EIGHT}),
    ("slots on other nodes or without GPUs hold nothing here",
     [("placed", "a", 1, slots((0, "n2", 8), (1, NODE, 0)))], {}),
    ("two workers share a node: the lowest free GPUs, in placement order",
     [("placed", "a", 1, HALF), ("see",), ("placed", "b", 1, slots((3, NODE, 2)))],
     {**{d: ("a", 1, 0) for d in range(4)}, 4: ("b", 1, 3), 5: ("b", 1, 3)}),
    ("ranks of one gang on one node pack in rank order",
     [("placed", "a", 1, slots((1, NODE, 2), (0, NODE, 2)))],
     {0: ("a", 1, 0), 1: ("a", 1, 0), 2: ("a", 1, 1), 3: ("a", 1, 1)}),
    ("the same placement delivered again changes nothing",
     [("placed", "a", 1, WHOLE), ("see",), ("placed", "a", 1, WHOLE)],
     {d: ("a", 1, 0) for d in EIGHT}),
    ("a newer attempt replaces the older",
     [("placed", "a", 1, WHOLE), ("placed", "a", 2, slots((3, NODE, 8)))],
     {d: ("a", 2, 3) for d in EIGHT}),
    ("an older attempt delivered late is ignored",
     [("placed", "a", 2, WHOLE), ("placed", "a", 1, slots((5, NODE, 8)))],
     {d: ("a", 2, 0) for d in EIGHT}),
    ("a worker that exited frees its GPUs (a requeue says nothing else)",
     [("placed", "a", 1, WHOLE), ("exited", "a", 1, 0)], {}),
    ("an exit of an older attempt does not free the newer one",
     [("placed", "a", 2, WHOLE), ("exited", "a", 1, 0)], {d: ("a", 2, 0) for d in EIGHT}),
    ("an exit of another rank frees nothing of this one",
     [("placed", "a", 1, WHOLE), ("exited", "a", 1, 1)], {d: ("a", 1, 0) for d in EIGHT}),
    ("a job's end frees its GPUs",
     [("placed", "a", 1, WHOLE), ("ended", "a", 1)], {}),
    ("an end of an older attempt leaves the newer one",
     [("placed", "a", 3, WHOLE), ("ended", "a", 2)], {d: ("a", 3, 0) for d in EIGHT}),
    ("a placement delivered again after the job ended is not taken again",
     [("placed", "a", 1, WHOLE), ("ended", "a", 1), ("placed", "a", 1, WHOLE)], {}),
    ("a placement delivered again after its worker exited is not taken again",
     [("placed", "a", 1, WHOLE), ("exited", "a", 1, 0), ("placed", "a", 1, WHOLE)], {}),
    ("a resumed job (a new attempt after its end) holds the GPUs again",
     [("placed", "a", 1, WHOLE), ("ended", "a", 1), ("placed", "a", 2, WHOLE)],
     {d: ("a", 2, 0) for d in EIGHT}),
    ("a newer placement of a GPU takes it from a worker whose end was missed",
     [("placed", "a", 1, WHOLE), ("see",), ("placed", "b", 1, slots((0, NODE, 8)))],
     {d: ("b", 1, 0) for d in EIGHT}),
    ("a GPU freed by one job goes to the next; the others stay where they were",
     [("placed", "a", 1, HALF), ("placed", "b", 1, slots((0, NODE, 4))), ("see",),
      ("ended", "a", 1), ("placed", "c", 1, slots((0, NODE, 2))), ("see",)],
     {**{d: ("b", 1, 0) for d in range(4, 8)}, 0: ("c", 1, 0), 1: ("c", 1, 0)}),
]


@pytest.mark.parametrize(("name", "facts", "want"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_who_holds_each_gpu(name: str, facts: list[tuple[Any, ...]],
                            want: dict[int, tuple[str, int, int]]) -> None:
    assert apply(Placements(NODE), facts) == want


def test_gpus_are_assigned_once_seen_and_only_those_present() -> None:
    p = Placements(NODE)
    p.placed("a", 1, WHOLE)
    assert p.owners([]) == {}  # no GPU read yet: nothing fixed
    assert p.snapshot() == {"a/0": {"attempt": 1, "gpus": 8, "devices": None}}
    assert set(p.owners([0, 1, 2, 3, 4, 5, 6, 7])) == set(EIGHT)
    assert set(p.owners([0, 1, 2])) == {0, 1, 2}  # a GPU the tool missed this time
    assert p.snapshot()["a/0"]["devices"] == EIGHT


def test_ends_are_remembered_within_a_bound() -> None:
    p = Placements(NODE)
    p.placed("old", 1, WHOLE)
    p.ended("old", 1)
    for i in range(REMEMBERED):  # jobs placed here since
        p.placed(f"j{i}", 1, slots((0, NODE, 1)))
        p.ended(f"j{i}", 1)
    assert len(p._newest) == REMEMBERED
    p.placed("old", 1, WHOLE)  # so long ago that it is forgotten: taken as new
    assert set(p.owners(EIGHT)) == set(EIGHT)


def record(job: str, status: str, attempt: int, started_at: float, *node_gpus: tuple[str, int],
           exits: dict[int, int] | None = None) -> JobRecord:
    spec = JobSpec(name="t", workers=len(node_gpus), gpus_per_worker=1, command=["true"])
    return JobRecord(id=job, spec=spec, submitted_at=0.0, status=status,  # type: ignore[arg-type]
                     attempt=attempt, started_at=started_at, exits=exits or {},
                     slots=slots(*((r, n, g) for r, (n, g) in enumerate(node_gpus))))


def test_read_from_job_records_then_the_same_events_again() -> None:
    """The agent's start: the records it reads, then the events from a few
    minutes before, which the records already reflect or supersede."""
    now = time.time()
    records = [
        record("new", "running", 1, now - 10, (NODE, 4)),
        record("old", "running", 2, now - 100, (NODE, 4), (NODE, 4), exits={1: 0}),
        record("stopping", "stopping", 1, now - 50, ("n2", 8)),
        record("done", "completed", 1, now - 500, (NODE, 8)),
        record("queued", "pending", 3, 0.0, (NODE, 8)),  # holds nothing, whatever it says
    ]
    p = Placements(NODE)
    p.read(records)
    # old was placed first (its id sorts last): it packs first; its rank 1 exited.
    want = {**{d: ("old", 2, 0) for d in range(4)},
            **{d: ("new", 1, 0) for d in range(4, 8)}}
    assert apply(p, [("see",)]) == want
    replay = [("placed", "old", 1, slots((0, NODE, 8))), ("exited", "old", 1, 0),
              ("placed", "old", 2, slots((0, NODE, 4), (1, NODE, 4))),
              ("exited", "old", 2, 1), ("placed", "done", 1, slots((0, NODE, 8))),
              ("ended", "done", 1), ("placed", "new", 1, slots((0, NODE, 4)))]
    assert apply(p, replay) == want
    assert apply(p, [("ended", "old", 2), ("placed", "next", 1, slots((0, NODE, 4)))]) == {
        **{d: ("new", 1, 0) for d in range(4, 8)}, **{d: ("next", 1, 0) for d in range(4)}}


def test_telemetry_names_the_owner_of_each_gpu() -> None:
    data = NodeTelemetryData(cpu_pct=1.0, mem_used_bytes=1, mem_total_bytes=2, load1=0.0,
                             gpus=[GpuMetrics(index=0, util_pct=99.0), GpuMetrics(index=1)])
    assert attributed(data, {}) is data
    out = attributed(data, {0: Owner("a", 2, 5)})
    assert (out.gpus[0].job, out.gpus[0].attempt, out.gpus[0].rank) == ("a", 2, 5)
    assert out.gpus[0].util_pct == 99.0 and out.gpus[1].job is None
    wire = out.model_dump(mode="json")["gpu_columns"]
    assert (wire["job"], wire["attempt"], wire["rank"]) == (["a", None], [2, None], [5, None])
    idle = data.model_dump(mode="json")["gpu_columns"]
    assert "job" not in idle and "rank" not in idle  # left out when no GPU is held


def test_a_gpu_names_its_whole_owner_or_none() -> None:
    with pytest.raises(ValueError, match="together"):
        GpuMetrics(index=0, job="a")
    with pytest.raises(ValueError):
        GpuMetrics(index=0, job="not a key", attempt=1, rank=0)
