"""Workers' output in the real engine (chDB): a ``log.worker`` batch becomes
one ``logs`` row per line, in the order printed, with job, attempt, rank,
node and stream; a redelivered batch adds nothing; the rate limit's meta line
carries the drop count; escaped bytes stay escaped. Parsed lines become
``job_metrics`` rows (origin ``log``) and the job queries prefer the SDK's
rows when a job has both."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from libs.events import JobTelemetry, JobTelemetryData, encode_event
from libs.log_shipper import Batcher, LogLimits
from services.lens_collector.ingest import ROUTES, Item, store
from services.lens_collector.log_telemetry import COLUMNS, JobFormat, LogTelemetry
from services.lens_collector.queries import resolve

OUTPUT = ROUTES[-1]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
# Megatron-LM's training_log line (megatron/training/training.py), as printed.
MEGATRON = (" [2026-12-01 12:00:0{i}] iteration        {it}/     100 | consumed samples: "
            "{s} | elapsed time per iteration (ms): 1234.5 | learning rate: 3.000000E-04 | "
            "global batch size:    32 | lm loss: {loss} | loss scale: 1.0 | grad norm: 1.234 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 |")


def batches(job: str, lines: list[tuple[bytes, str]], *, rank: int = 0, rate: int = 1 << 30,
            at: float = T0) -> list:  # type: ignore[type-arg]
    limits = LogLimits(rate_bytes_s=rate, min_rate_bytes_s=rate, batch_lines=3)
    b = Batcher.for_worker(job, 1, rank, "node-1", 1, limits)
    out = []
    for i, (raw, stream) in enumerate(lines):
        out += b.feed([raw], stream, at + i * 0.01)  # type: ignore[arg-type]
    return out + b.take(at + 10, flush=True)


def items(events: list, delivered: int = 1) -> list[Item]:  # type: ignore[type-arg]
    return [Item(encode_event(e), e.id, e.job, delivered, ref=e.id) for e in events]


def test_lines_land_in_order_with_their_worker(client, db: str) -> None:  # type: ignore[no-untyped-def]
    lines = [(f"line {i}".encode(), "stderr" if i % 2 else "stdout") for i in range(8)]
    lines.append((b"bad \xff\xfe bytes\r\n", "stdout"))
    sent = batches("job-a", lines, rank=3)
    assert len(sent) == 3
    assert store(client, db, OUTPUT, items(sent)) == (3, [])
    rows = client.query(
        f"SELECT seq, message, stream, rank, attempt, node, service FROM {db}.logs FINAL "
        "WHERE job = 'job-a' ORDER BY seq").result_rows
    assert [r[1] for r in rows][:8] == [f"line {i}" for i in range(8)]
    assert rows[8][1] == "bad \\xff\\xfe bytes"
    assert [r[0] for r in rows] == list(range(9))
    assert {r[3:] for r in rows} == {(3, 1, "node-1", "worker")}
    assert rows[1][2] == "stderr" and rows[0][2] == "stdout"
    # Redelivered after a crash before the ack: stored once.
    stored, refused = store(client, db, OUTPUT, items(sent, delivered=2))
    assert refused == [] and stored == 0
    count = client.query(f"SELECT count() FROM {db}.logs WHERE job = 'job-a'").result_rows
    assert count == [(9,)]


def test_drops_are_counted_where_lines_are_read(client, db: str) -> None:  # type: ignore[no-untyped-def]
    # 200 bytes/s with a 5 s burst: the 2 kB lines in between are dropped.
    lines = [(b"a" * 100, "stdout"), (b"b" * 2000, "stdout"), (b"c" * 2000, "stdout"),
             (b"d" * 10, "stdout")]
    sent = batches("job-b", lines, rate=200)
    store(client, db, OUTPUT, items(sent))
    rows = client.query(f"SELECT message, stream, dropped FROM {db}.logs FINAL "
                        "WHERE job = 'job-b' ORDER BY seq").result_rows
    assert [r[0][:1] for r in rows] == ["a", "p", "d"]
    assert rows[1][1] == "meta" and rows[1][2] == 2
    assert "2 line(s), 4000 bytes" in rows[1][0]


def test_a_long_line_is_cut_with_a_marker(client, db: str) -> None:  # type: ignore[no-untyped-def]
    sent = batches("job-c", [(b"x" * 20000, "stdout")])
    store(client, db, OUTPUT, items(sent))
    (message,), = client.query(f"SELECT message FROM {db}.logs WHERE job = 'job-c'").result_rows
    assert message.startswith("x" * 16384)
    assert message.endswith("[primus-safe: line cut, 3616 more bytes]")


def test_parsed_lines_become_job_metrics_and_the_sdk_wins(client, db: str) -> None:  # type: ignore[no-untyped-def]
    lines = [(b"megatron banner", "stdout")] + [
        (MEGATRON.format(i=i, it=i + 1, s=32 * (i + 1), loss="nan" if i == 2 else
                         f"{5.0 - i:.6E}").encode(), "stdout") for i in range(4)]
    sent = batches("job-d", lines, rank=7)
    store(client, db, OUTPUT, items(sent))
    parser = LogTelemetry(lambda job: JobFormat("auto"))
    rows = [r for e in sent for r in parser.rows(json.loads(encode_event(e)))]
    assert [r[COLUMNS.index("iteration")] for r in rows] == [1, 2, 3, 4]
    losses = [r[COLUMNS.index("loss")] for r in rows]
    assert losses[0] == 5.0 and math.isnan(losses[2])
    assert {r[COLUMNS.index("rank")] for r in rows} == {7}
    assert rows[0][COLUMNS.index("step_time_s")] == pytest.approx(1.2345)
    assert rows[0][COLUMNS.index("learning_rate")] == pytest.approx(3e-4)
    client.insert(f"{db}.job_metrics", rows, column_names=COLUMNS)

    def series() -> list[tuple[int, float]]:
        sql, params = resolve("job_series", {"job": "job-d"}, db)
        return [(r[0], r[1]) for r in client.query(sql, parameters=params).result_rows]

    assert [it for it, _ in series()] == [1, 2, 3, 4]
    # The job also reports through the SDK: its rows alone are read.
    sdk = [JobTelemetry(source="t", job="job-d", data=JobTelemetryData(
        rank=0, iteration=i, loss=9.0)) for i in (1, 2)]
    store(client, db, ROUTES[1], [Item(encode_event(e), e.id, "job-d", ref=e.id) for e in sdk])
    assert series() == [(1, 9.0), (2, 9.0)]


def test_a_job_that_prints_no_framework_is_not_parsed() -> None:
    parser = LogTelemetry(lambda job: None)
    sent = batches("job-e", [(f"epoch {i} done".encode(), "stdout") for i in range(10)])
    assert [r for e in sent for r in parser.rows(json.loads(encode_event(e)))] == []
    assert parser.jobs["job-e"].fmt is None
    none = LogTelemetry(lambda job: JobFormat("none"))
    line = MEGATRON.format(i=0, it=1, s=32, loss="1.0").encode()
    sent = batches("job-f", [(line, "stdout")])
    assert none.rows(json.loads(encode_event(sent[0]))) == []


async def test_log_rules_read_the_stored_lines_with_the_engine(client, db: str) -> None:  # type: ignore[no-untyped-def]
    """Every built-in log rule's pattern runs in the engine (RE2), and an
    RCCL watchdog line opens an infra alert about its job."""
    import time as clock

    from libs.events import LensAlert
    from services.lens_collector.alerting import LOG_SQL, AlertLoop
    from services.lens_collector.alerts import AlertConfig, AlertEngine
    from services.lens_collector.log_alerts import LogAlerts, load_rules

    now = clock.time()
    timeout = ("[rank3]:[E1203 10:00:00.1 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught "
               "collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for "
               "600000 milliseconds before timing out.")
    sent = batches("job-g", [(b"step 1", "stdout"), (timeout.encode(), "stderr"),
                             (b"Traceback (most recent call last):", "stderr")], rank=3,
                   at=now - 4)
    store(client, db, OUTPUT, items(sent))
    rules = LogAlerts(load_rules())

    async def query(sql: str, params: dict) -> list:  # type: ignore[type-arg]
        return client.query(sql.replace("{db}", db), parameters=params).result_rows

    published: list[LensAlert] = []

    async def publish(event: LensAlert) -> None:
        published.append(event)

    loop = AlertLoop(AlertEngine(AlertConfig()), query=query, publish=publish, source="t",
                     interval_s=5, lag_s=0, log_alerts=rules)
    rows = await query(LOG_SQL, {"frm": int((now - 60) * 1000), "to": int(now * 1000) + 5000,
                                 "pattern": rules.any_pattern})
    assert [r[4] for r in rows] == [timeout, "Traceback (most recent call last):"]
    out = await loop._log_window({"frm": int((now - 60) * 1000), "to": int(now * 1000) + 5000},
                                 now)
    assert {(t.rule, t.fault_class, t.job) for t in out} == {
        ("log_collective_timeout", "infra", "job-g"), ("log_traceback", "user", "job-g")}


def test_retention_is_a_setting(client, db: str, clickhouse_dsn: str) -> None:  # type: ignore[no-untyped-def]
    from libs.settings import Settings
    from services.lens_collector.app import LensCollector

    def ttl() -> str:
        (ddl,), = client.query("SELECT create_table_query FROM system.tables WHERE database = "
                               "{d:String} AND name = 'logs'", parameters={"d": db}).result_rows
        return ddl

    assert "toIntervalDay(14)" in ttl()
    collector = LensCollector(Settings(clickhouse_dsn=clickhouse_dsn, clickhouse_database=db,
                                       lens_logs_ttl_days=3), evaluate_alerts=False)
    collector.client = client
    collector._logs_retention()
    assert "toIntervalDay(3)" in ttl() and "toIntervalDay(14)" not in ttl()
    collector._logs_retention()  # the same again: nothing to change
    assert "toIntervalDay(3)" in ttl()


def test_drops_at_the_very_end_are_still_told() -> None:
    limits = LogLimits(rate_bytes_s=100, min_rate_bytes_s=100, burst_s=1, flush_s=60)
    b = Batcher.for_worker("job-h", 1, 0, None, 1, limits)
    assert b.feed([b"kept"], "stdout", 0.0) == []  # pending, not yet due
    assert b.feed([b"y" * 500], "stdout", 0.1) == []  # over the rate: dropped
    out = b.take(0.2, flush=True)  # the worker ended
    texts = [t for e in out for t in e.data.text]
    assert texts[0] == "kept" and texts[1].startswith("primus-safe: 1 line(s), 500 bytes")
    assert sum(e.data.dropped_lines for e in out) == 1
    assert [e.data.seq for e in out] == [0, 1]


def test_binary_output_never_makes_a_batch_too_big_for_the_bus() -> None:
    """NUL bytes are valid UTF-8 that JSON writes six bytes long: batches
    of such lines still stay under NATS's 1 MiB message limit."""
    b = Batcher.for_worker("job-i", 1, 0, None, 1, LogLimits())
    line = bytes(range(32)) * 512  # 16 KiB of control characters
    out = []
    for i in range(200):
        out += b.feed([line], "stdout", i * 0.001)
    out += b.take(1.0, flush=True)
    assert sum(len(e.data.text) for e in out) == 200
    assert max(len(encode_event(e)) for e in out) < 1 << 20
