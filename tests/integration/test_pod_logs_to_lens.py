"""Workers' output on Kubernetes, end to end: a bench agent set to follow
the kubelet's pod log directory (a ``/var/log/pods``-shaped tree the test
writes as containerd does) finds its job pods through the scheduler's job
records, ships their lines, and lens-collector (in this process, real
NATS, the chDB engine) stores each with its job, attempt, rank, node and
stream. A restarted agent goes on where it stopped: only the new lines are
sent again, and nothing is stored twice."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.k8s_manifests import CONTAINER, pod_name
from libs.events import JobSpec, WorkerSlot
from libs.records import JobRecord
from libs.settings import Settings
from services.bench.agent import BenchAgent
from services.bench.routes import AGENT
from services.lens_collector.app import LensCollector
from tests.helpers import lens_rows as lens
from tests.helpers import until

pytestmark = pytest.mark.timeout(120)

NS, NODE, JOB = "primus", "gpu-07", "Pod_Job-1"  # not a DNS label: its pods' names are hashed


def cri(stream: str, text: str, tag: str = "F") -> bytes:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"{now}123Z {stream} {tag} {text}\n".encode()


def write(container: Path, *records: bytes) -> None:
    with open(container / "0.log", "ab") as f:
        f.write(b"".join(records))


async def rows_of(bus: Bus, n: int) -> list[dict[str, Any]] | None:
    rows = await lens(bus, "worker_logs", job=JOB, limit=1000)
    return rows if len(rows) >= n else None


def start_agent(tmp_path: Path, nats_url: str, root: Path) -> BenchAgent:
    config = tmp_path / "bench.yaml"
    config.write_text("probes: []\n")
    settings = Settings(nats_url=nats_url, state_dir=tmp_path / "agent-state",
                        agent_pod_logs_dir=root, k8s_namespace=NS)
    return BenchAgent(settings, NODE, config)


async def test_pod_logs_reach_lens_with_their_worker_and_resume_after_a_restart(
        tmp_path: Path, nats_url: str, lens_collector: tuple[LensCollector, Bus]) -> None:
    _, bus = lens_collector
    record = JobRecord(id=JOB, spec=JobSpec(name="t", workers=2, command=["train"]),
                       submitted_at=time.time(), status="running", attempt=3,
                       started_at=time.time(),
                       slots=[WorkerSlot(rank=r, node=NODE, gpus=0) for r in (0, 1)])
    await (await bus.kv("jobs")).put(JOB, record.model_dump_json().encode())
    root = tmp_path / "var-log-pods"
    pods = {}
    for rank in (0, 1):
        pods[rank] = root / f"{NS}_{pod_name(JOB, 3, rank)}_{uuid.uuid4()}" / CONTAINER
        pods[rank].mkdir(parents=True)
    other = root / f"kube-system_{pod_name(JOB, 3, 0)}_{uuid.uuid4()}" / CONTAINER
    other.mkdir(parents=True)  # the same name in another namespace: not a worker of ours
    write(other, cri("stdout", "never shipped"))
    write(pods[0], cri("stdout", "rank 0 says hello"), cri("stderr", "rank 0 warns"),
          cri("stdout", "a line split ", "P"), cri("stdout", "by the runtime"))
    write(pods[1], cri("stdout", "rank 1 says hello"))

    agent_bus = await Bus.connect(nats_url, "bench-agent", routes=AGENT)
    agent = start_agent(tmp_path, nats_url, root)
    await agent.start(agent_bus)
    try:
        rows = await until(lambda: rows_of(bus, 4), "the pods' lines in Lens")
        got = {(r["rank"], r["stream"], r["message"]) for r in rows}
        assert got == {(0, "stdout", "rank 0 says hello"), (0, "stderr", "rank 0 warns"),
                       (0, "stdout", "a line split by the runtime"),
                       (1, "stdout", "rank 1 says hello")}
        assert {(r["attempt"], r["node"]) for r in rows} == {(3, NODE)}
        assert agent.health()["pod_logs"]["pods"] == 2
    finally:
        await agent.stop()
        await agent_bus.close()

    # Printed while the agent was away; the new agent sends only these.
    write(pods[0], cri("stdout", "rank 0 after the restart"))
    write(pods[1], cri("stderr", "rank 1 after the restart"))
    agent_bus = await Bus.connect(nats_url, "bench-agent", routes=AGENT)
    again = start_agent(tmp_path, nats_url, root)
    await again.start(agent_bus)
    try:
        rows = await until(lambda: rows_of(bus, 6), "the new lines in Lens")
        assert again.health()["pod_logs"]["batches_sent"] == 2  # one per pod, nothing older
        assert len(rows) == 6 and [r["seq"] for r in rows if r["rank"] == 0] == [0, 1, 2, 3]
        assert (1, "stderr", "rank 1 after the restart") in {
            (r["rank"], r["stream"], r["message"]) for r in rows}
    finally:
        await again.stop()
        await agent_bus.close()
