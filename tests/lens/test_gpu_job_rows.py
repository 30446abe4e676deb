"""GPU rows that name their job (migration 9) against the real engine
(chDB): the job, attempt and rank of each GPU land in ``gpu_metrics`` from
both wire forms, as the reference rows say; the engine refuses a job that
is not a key; an older collector stores the same messages without them; an
existing database upgrades in place; and GPU-hours per job and per
workspace come out exact for known samples, gaps and duplicates included."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from libs.events import (
    GpuMetrics,
    JobPlaced,
    JobPlacedData,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    NodeTelemetry,
    NodeTelemetryData,
    WorkerSlot,
    encode_event,
)
from libs.store import migrate
from services.lens_collector.ingest import ROUTES, SETTINGS, Item, store
from services.lens_collector.queries import resolve
from services.lens_collector.rollups import backfill
from services.lens_collector.rows import COLUMNS, rows_for
from services.lens_collector.schema import MIGRATIONS
from tests.lens.lens_seed import node_event

NODE_ROUTE = ROUTES[0]
BEFORE_9 = tuple(m for m in MIGRATIONS if m.version < 9)


def gpu_rows(client, db: str) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    return client.query(f"SELECT event_id, gpu, util_pct, job, attempt, rank "
                        f"FROM {db}.gpu_metrics ORDER BY event_id, gpu").result_rows


def as_version_1(event: NodeTelemetry, event_id: str) -> bytes:
    """The message as a version 1 agent sends it: one object per GPU."""
    doc = {**json.loads(encode_event(event)), "version": 1, "id": event_id}
    doc["data"].pop("gpu_columns")
    doc["data"]["gpus"] = [g.model_dump(mode="json", exclude_none=True) for g in event.data.gpus]
    return json.dumps(doc).encode()


def test_each_gpu_row_names_its_job_in_both_wire_forms(client, db: str) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    held = node_event("n1", now, 0, ("train-1", 2, 5))  # every GPU held
    mixed = node_event("n2", now, 1).model_copy(update={"data": node_event(
        "n2", now, 1).data.model_copy(update={"gpus": [
            GpuMetrics(index=0, util_pct=50.0, job="train-1", attempt=2, rank=6),
            GpuMetrics(index=1, util_pct=1.0)]})})
    idle = node_event("n3", now, 2)  # no GPU held: the wire form has no job arrays
    assert "job" not in json.loads(encode_event(idle))["data"]["gpu_columns"]
    assert json.loads(encode_event(mixed))["data"]["gpu_columns"]["job"] == ["train-1", None]
    v2 = [Item(encode_event(e), e.id, e.node or "") for e in (held, mixed, idle)]
    assert store(client, db, NODE_ROUTE, v2) == (3, [])
    old = [(held, "v1-held"), (idle, "v1-idle")]  # agents not yet upgraded
    assert store(client, db, NODE_ROUTE, [Item(as_version_1(e, i), i, "n1") for e, i in old]
                 ) == (2, [])
    expected = rows_for([(held, 0), (mixed, 0), (idle, 0)]
                        + [(e.model_copy(update={"id": i}), 0) for e, i in old])["gpu_metrics"]
    cols = [COLUMNS["gpu_metrics"].index(c) for c in ("event_id", "gpu", "util_pct", "job",
                                                      "attempt", "rank")]
    want = sorted(tuple(r[c] for c in cols) for r in expected)
    got = gpu_rows(client, db)
    assert got == want
    assert {(r[3], r[4], r[5]) for r in got if r[0] in (held.id, "v1-held")} == {("train-1", 2, 5)}
    assert {(r[3], r[4], r[5]) for r in got if r[0] == idle.id} == {("", 0, None)}
    assert [(r[1], r[3], r[5]) for r in got if r[0] == mixed.id] == [(0, "train-1", 6),
                                                                      (1, "", None)]


def test_the_engine_refuses_a_job_that_is_not_a_key(client, db: str) -> None:  # type: ignore[no-untyped-def]
    event = node_event("n1", datetime.now(UTC), 0, ("train-1", 1, 0))
    doc = json.loads(encode_event(event))
    doc["data"]["gpu_columns"]["job"][0] = "train 1; DROP"
    with pytest.raises(DatabaseError, match="gpu_jobs"):  # the CHECK, before any contract
        client.raw_insert(f"{db}.ingest_node", None, json.dumps(doc).encode(),
                          settings=SETTINGS, fmt="JSONEachRow")
    stored, refused = store(client, db, NODE_ROUTE, [Item(json.dumps(doc).encode(), event.id,
                                                          "n1", ref="bad")])
    assert stored == 0 and refused[0][0] == "bad" and "job" in refused[0][1]


def test_a_collector_before_migration_9_stores_them_without_the_job(client, database: str  # type: ignore[no-untyped-def]
                                                                    ) -> None:
    migrate(client, database, BEFORE_9)
    event = node_event("n1", datetime.now(UTC), 0, ("train-1", 1, 0))
    assert store(client, database, NODE_ROUTE, [Item(encode_event(event), event.id, "n1")]
                 ) == (1, [])
    assert client.query(f"SELECT count() FROM {database}.gpu_metrics").result_rows == [(4,)]
    old = client.query(f"SELECT event_id FROM {database}.gpu_metrics LIMIT 1").result_rows
    applied = migrate(client, database, MIGRATIONS)  # upgraded in place
    assert applied[0] == 9 and applied == [m.version for m in MIGRATIONS if m.version >= 9]
    assert gpu_rows(client, database)[0][3:] == ("", 0, None)  # old rows: no job
    assert old[0][0] == event.id
    later = node_event("n1", datetime.now(UTC), 1, ("train-1", 1, 0))
    store(client, database, NODE_ROUTE, [Item(encode_event(later), later.id, "n1")])
    assert {r[3] for r in gpu_rows(client, database) if r[0] == later.id} == {"train-1"}


# --------------------------------------------------------------------------- GPU-hours

START = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)


def sample(node: str, at_s: float, gpus: dict[int, tuple[str, int, int]]) -> NodeTelemetry:
    """One node sample at START + at_s; ``gpus``: index -> (job, attempt, rank)."""
    return NodeTelemetry(source="agent", node=node, time=START + timedelta(seconds=at_s),
                         data=NodeTelemetryData(cpu_pct=1.0, mem_used_bytes=1,
                                                mem_total_bytes=2, load1=0.0, gpus=[
            GpuMetrics(index=i, util_pct=50.0 + i, power_w=500.0, vram_used_bytes=1 << 30,
                       job=j, attempt=a, rank=r) for i, (j, a, r) in gpus.items()]
            + [GpuMetrics(index=7, util_pct=0.0)]))  # an idle GPU: counted for nobody


def submitted(job: str, workspace: str) -> JobSubmitted:
    return JobSubmitted(source="scheduler", job=job, time=START - timedelta(minutes=5),
                        data=JobSubmittedData(spec=JobSpec(name="t", workers=1, command=["x"],
                                                           workspace=workspace)))


@pytest.fixture(scope="module")
def hours(client, clickhouse_dsn: str) -> str:  # type: ignore[no-untyped-def]
    """Known samples, stored as the collector stores them:

    - a (research), attempt 1: n1 GPUs 0 and 1 every 2 s for an hour
      (0, 2, ... 3598 s): 1 GPU-hour each;
    - a, attempt 2: n2 GPU 0 every second for 0..599 s and 1200..1799 s (the
      agent was away in between, the GPU held all along);
    - b (prod): n2 GPU 1 every second for half an hour; each of its samples
      stored twice (as a sample sent twice under two ids would be).
    """
    db = f"gh_{START.strftime('%H%M%S')}"
    migrate(client, db, MIGRATIONS)
    a1 = {0: ("a", 1, 0), 1: ("a", 1, 0)}
    events = [sample("n1", t, a1) for t in range(0, 3600, 2)]
    events += [sample("n2", t, {0: ("a", 2, 0), 1: ("b", 1, 3)}) for t in range(0, 600)]
    events += [sample("n2", t, {1: ("b", 1, 3)}) for t in range(600, 1200)]
    events += [sample("n2", t, {0: ("a", 2, 0), 1: ("b", 1, 3)}) for t in range(1200, 1800)]
    assert store(client, db, NODE_ROUTE, [Item(encode_event(e), e.id, e.node or "")
                                          for e in events]) == (len(events), [])
    # Copies under other ids: no merge ever folds them, as it would exact copies.
    twice = [[*r[:3], f"{r[3]}-copy", *r[4:]] for r in rows_for([(e, 0) for e in events])[
        "gpu_metrics"] if r[-3] == "b"]
    client.insert(f"{db}.gpu_metrics", twice, column_names=COLUMNS["gpu_metrics"])
    control = [submitted("a", "research"), submitted("b", "prod"),
               JobPlaced(source="scheduler", job="a", time=START, data=JobPlacedData(
                   attempt=1, workers=[WorkerSlot(rank=0, node="n1", gpus=2)]))]
    rows = rows_for([(e, i) for i, e in enumerate(control)])["events"]
    client.insert(f"{db}.events", rows, column_names=COLUMNS["events"])
    backfill(client, db, START, START + timedelta(hours=2))
    return db


def query(client, db: str, name: str, **params: Any) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    sql, values = resolve(name, params, db)
    result = client.query(sql, parameters=values)
    return [dict(zip(result.column_names, r, strict=True)) for r in result.result_rows]


# a, attempt 2: 1200 distinct samples from 0 to 1799 s: the span plus one mean interval.
A2_S = 1799 * 1200 / 1199


def test_gpu_hours_per_gpu_of_a_job(client, hours: str) -> None:  # type: ignore[no-untyped-def]
    gpus = {(g["node"], g["gpu"]): g for g in query(client, hours, "job_gpus", job="a")}
    assert set(gpus) == {("n1", 0), ("n1", 1), ("n2", 0)}
    assert gpus["n1", 0]["gpu_hours"] == 1.0 and gpus["n1", 1]["gpu_hours"] == 1.0
    assert gpus["n2", 0]["gpu_hours"] == round(A2_S / 3600, 6)
    assert abs(A2_S - 1800) < 1  # within one sample interval of the time held
    assert (gpus["n1", 1]["rank"], gpus["n1", 1]["attempt"]) == (0, 1)
    assert gpus["n2", 0]["attempt"] == 2 and gpus["n1", 1]["util_pct"] == 51.0
    assert gpus["n1", 0]["samples"] == 1800 and gpus["n1", 0]["power_w"] == 500.0
    [b] = query(client, hours, "job_gpus", job="b")
    assert (b["node"], b["gpu"], b["rank"], b["samples"]) == ("n2", 1, 3, 1800)
    assert b["gpu_hours"] == 0.5  # 1800 samples at 1 s, every one stored twice
    assert client.query(f"SELECT count() FROM {hours}.gpu_metrics WHERE job = 'b'"
                        ).result_rows == [(3600,)]
    assert query(client, hours, "job_gpus", job="a", minutes=1) == []  # three hours ago


def test_gpu_hours_per_job_and_per_workspace(client, hours: str) -> None:  # type: ignore[no-untyped-def]
    jobs = {r["job"]: r for r in query(client, hours, "gpu_hours")}
    assert set(jobs) == {"a", "b"}  # the idle GPU is nobody's
    assert jobs["a"]["gpu_hours"] == round(2 + A2_S / 3600, 6)
    assert (jobs["a"]["workspace"], jobs["a"]["attempts"], jobs["a"]["gpus"]) == (
        "research", 2, 3)
    assert (jobs["b"]["workspace"], jobs["b"]["gpu_hours"]) == ("prod", 0.5)
    spaces = {r["workspace"]: r for r in query(client, hours, "workspace_gpu_hours")}
    assert {w: (r["jobs"], r["gpu_hours"]) for w, r in spaces.items()} == {
        "research": (1, round(2 + A2_S / 3600, 6)), "prod": (1, 0.5)}
    assert [r["job"] for r in query(client, hours, "gpu_hours", workspace="prod")] == ["b"]
    assert [r["job"] for r in query(client, hours, "gpu_hours", job="a")] == ["a"]
    # The second half hour: only a's first attempt ran then (samples 1800..3598 s).
    half = int((START + timedelta(minutes=30)).timestamp() * 1000)
    [late] = query(client, hours, "gpu_hours", since_ms=half)
    assert (late["job"], late["gpu_hours"]) == ("a", 1.0)
    first = query(client, hours, "gpu_hours", until_ms=half)
    assert {r["job"]: r["gpu_hours"] for r in first} == {
        "a": round((2 * 1800 + A2_S) / 3600, 6), "b": 0.5}
