"""A write of the scheduler that fails (NATS restarting, a request that
timed out) must not leave its records in memory ahead of what is stored,
announced and launched. A chaos run (seed 15, ``tests/chaos``) found the
job stuck for good: nats-server came back while the scheduler was placing
it; the save of the placement timed out; the record in memory said
"running", so no later cycle placed it again, while nothing had been
launched and the bucket still said "pending".

The scheduler runs in-process on a real nats-server with the local driver
(real worker processes). One write fails once, as NATS makes it fail: a
save or an announcement that never reached the server, or a save that
did and whose answer was lost. Each time the job must still run once,
complete, and be announced placed and completed exactly once. (A lost
submission save and a completion save whose answer was lost came out
right before the fix too, through later saves and the redelivered exit;
they stay to hold the paths that take a failed step back.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import Event, JobPlaced, JobSpec, JobSubmitted, JobSubmittedData
from libs.records import JobRecord
from libs.settings import Settings
from services.scheduler.app import Scheduler
from tests.helpers import ROOT, fail_once, ready_nodes, until

pytestmark = pytest.mark.timeout(120)


def saved(status: str) -> Callable[[Any], bool]:
    return lambda record: isinstance(record, JobRecord) and record.status == status


def announced(kind: type[Event]) -> Callable[[Any], bool]:
    return lambda event: isinstance(event, kind)


CASES = {
    "submission save lost": ("put", saved("pending"), False),
    "placement save lost": ("put", saved("running"), False),
    "placement save landed, answer lost": ("put", saved("running"), True),
    "placement announcement lost": ("publish", announced(JobPlaced), False),
    "completion save lost": ("put", saved("completed"), False),
    "completion save landed, answer lost": ("put", saved("completed"), True),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_write_that_fails_once_delays_the_job_and_loses_nothing(
        case: str, nats_url: str, bus: Bus, tmp_path: Path) -> None:
    what, when, lands = CASES[case]
    state = tmp_path / "state"
    await ready_nodes(bus, {"n1": (1, "r1")})
    own = await Bus.connect(nats_url, "scheduler")
    scheduler = Scheduler(Settings(nats_url=nats_url, state_dir=state))
    await scheduler.start(own)
    assert scheduler.kv is not None
    if what == "put":
        scheduler.kv.put, failed = fail_once(scheduler.kv.put, when, lands=lands)  # type: ignore[method-assign]
    else:
        own.publish, failed = fail_once(own.publish, when, lands=lands)  # type: ignore[method-assign]
    try:
        spec = JobSpec(name="j", workers=1, gpus_per_worker=1, workdir=str(ROOT),
                       command=["python", "-c", "import time; time.sleep(0.5)"])
        await bus.publish(JobSubmitted(source="test", job="j", data=JobSubmittedData(spec=spec)))
        jobs = await bus.kv("jobs")

        async def completed() -> dict[str, Any] | None:
            """The stored record once it says completed and that is announced."""
            record = json.loads((await jobs.get("j")).value)
            done = await bus.js.stream_info("CONTROL", subjects_filter="safe.job.j.completed")
            return record if record["status"] == "completed" and done.state.subjects else None

        record = await until(completed, f"the job to complete ({case})", 45)
        assert failed, f"the {case.split(',')[0]} was never tried"
        assert record["attempt"] == 1, record
        for kind in ("placed", "completed"):
            info = await bus.js.stream_info("CONTROL", subjects_filter=f"safe.job.j.{kind}")
            assert info.state.subjects == {f"safe.job.j.{kind}": 1}, (kind, info.state.subjects)
        assert scheduler.health()["jobs"] == {"completed": 1}, scheduler.health()
        assert not scheduler._unfinished
    finally:
        await scheduler.stop()
        await own.close()
        reap_all(state)
