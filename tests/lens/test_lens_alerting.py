"""The alert loop's shell with a fake store and bus: what it asks for, what
it publishes, and that a restart neither forgets nor repeats an alert."""

from __future__ import annotations

from typing import Any

from libs.events import LensAlert, encode_event, parse_event
from services.lens_collector.alerting import (
    JOB_SQL,
    LIFECYCLE_SQL,
    NODE_SQL,
    OPEN_SQL,
    AlertLoop,
)
from services.lens_collector.alerts import AlertConfig, AlertEngine, ThresholdRule

CONFIG = AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=75), node_down_s=30,
                     job_hang_s=1000, checkpoint_max_age_s=10_000)


class Store:
    """Answers the loop's queries from canned rows; remembers what it was asked."""

    def __init__(self) -> None:
        self.gpus: list[tuple[Any, ...]] = []
        self.nodes: list[tuple[Any, ...]] = []
        self.open: list[tuple[Any, ...]] = []
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        self.asked.append((sql, params))
        if sql == OPEN_SQL:
            return self.open
        if sql.startswith("SELECT node, gpu"):
            return self.gpus
        if sql == NODE_SQL:
            return self.nodes
        if sql in (JOB_SQL, LIFECYCLE_SQL):
            return []
        raise AssertionError(sql)


def make(store: Store, clock: list[float], sent: list[LensAlert]) -> AlertLoop:
    async def publish(event: LensAlert) -> None:
        sent.append(parse_event(encode_event(event)))  # type: ignore[arg-type]

    return AlertLoop(AlertEngine(CONFIG), query=store, publish=publish, source="lens-collector",
                     interval_s=5, lag_s=2, clock=lambda: clock[0])


async def test_windows_queries_and_published_alerts() -> None:
    store, clock, sent = Store(), [1000.0], []
    loop = make(store, clock, sent)
    store.gpus = [("n1", 3, 91.0, 0.5, 0.5)]
    store.nodes = [("n1", 997_000)]
    await loop.evaluate()
    [alert] = sent
    assert alert.subject == "safe.lens.alert.n1" and alert.node == "n1" and alert.job is None
    assert (alert.data.rule, alert.data.state, alert.data.gpu) == ("gpu_temp_high", "open", 3)
    assert alert.id == f"{alert.data.alert_id}-open"  # a second evaluator's copy is a duplicate
    gpu_sql, params = next(a for a in store.asked if a[0].startswith("SELECT node, gpu"))
    assert "max(temp_c)" in gpu_sql and params["t"] == 80 and params["open"] == []
    assert params["to"] == 998_000 and params["frm"] == 993_000  # 5 s ending 2 s ago
    clock[0] += 5
    store.gpus = [("n1", 3, 70.0, 0.5, 0.5)]
    await loop.evaluate()
    assert [(a.data.state, a.data.alert_id) for a in sent[1:]] == [("closed", alert.data.alert_id)]
    params = [a[1] for a in store.asked if a[0].startswith("SELECT node, gpu")][-1]
    assert params["open"] == ["n1/gpu3"] and params["frm"] == 998_000


async def test_a_restart_reopens_nothing_and_notices_silence() -> None:
    store, clock, sent = Store(), [1000.0], []
    first = make(store, clock, sent)
    store.gpus = [("n1", 0, 95.0, None, None)]
    store.nodes = [("n1", 997_000), ("n2", 997_000)]
    await first.evaluate()
    [opened] = sent
    # The store now says the alert is open; a new process starts 60 s later.
    store.open = [("gpu_temp_high", "n1/gpu0", "n1", None, 0, 95.0, 80.0, "warning", "hot",
                   int(opened.data.opened_at.timestamp() * 1000))]
    store.nodes = [("n1", 1058_000), ("n2", 997_000)]  # n2 went quiet an hour ago... 60 s
    clock[0] = 1060.0
    second = make(store, clock, sent)
    await second.evaluate()
    rules = [(a.data.rule, a.data.state, a.node) for a in sent[1:]]
    assert ("gpu_temp_high", "open", "n1") not in rules  # not opened twice
    assert ("node_down", "open", "n2") in rules
    store.gpus = [("n1", 0, 60.0, None, None)]
    clock[0] += 5
    await second.evaluate()
    closed = [a for a in sent if a.data.state == "closed" and a.data.rule == "gpu_temp_high"]
    assert closed and closed[0].data.alert_id == opened.data.alert_id


async def test_one_replica_evaluates_and_a_standby_takes_over_when_it_stops(
        nats_url: str) -> None:
    """Two collectors' alert loops on a real NATS: only the leader of the
    ``lens-alerts`` lease asks the store; when it stops, the other does."""
    import asyncio

    from libs.bus import Bus
    from libs.leader import LeaderElection

    buses = [await Bus.connect(nats_url, f"lens-{i}") for i in range(2)]
    await buses[0].ensure_topology()
    stores = [Store(), Store()]
    clock, sent = [1000.0], []
    loops, elections, tasks = [], [], []
    try:
        for i, bus in enumerate(buses):
            election = LeaderElection(bus, "lens-alerts", ttl_s=2, holder=f"replica-{i}")
            await election.start()
            loop = make(stores[i], clock, sent)
            loop.interval_s = 0.05
            elections.append(election)
            loops.append(loop)
            tasks.append(asyncio.create_task(loop.run(lambda e=election: e.is_leader)))
        await asyncio.sleep(0.5)
        leader = next(i for i, e in enumerate(elections) if e.is_leader)
        standby = 1 - leader
        assert stores[leader].asked and not stores[standby].asked
        await elections[leader].stop()  # releases the lease: the standby takes it at once
        tasks[leader].cancel()
        for _ in range(100):
            if stores[standby].asked:
                break
            await asyncio.sleep(0.05)
        assert stores[standby].asked and elections[standby].is_leader
        assert stores[standby].asked[0][0] == OPEN_SQL  # it first learns what is open
    finally:
        for task in tasks:
            task.cancel()
        for election in elections:
            await election.stop()
        for bus in buses:
            await bus.close()
