"""Jobs that can never run are refused at submit, on a real nats-server with
the real scheduler service and the real CLI: ``primus-safe submit`` exits 1
with the reason (file, line, field) and prints no id; a job the registered
nodes cannot hold is accepted as unschedulable, says so in ``explain``,
never holds the FIFO queue, and runs once nodes join; a refused event that
comes from elsewhere ends failed at once; with no scheduler the CLI submits
anyway and says so."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import JobSpec, JobSubmitted, JobSubmittedData
from services.scheduler.protocol import ADMISSION
from tests.helpers import ROOT, ready_nodes, run_cli, start_service, stop_process, until

pytestmark = pytest.mark.timeout(150)

SLEEP = ["python", "-c", "import time; time.sleep({s})"]


def job_file(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path



async def test_refused_at_submit_unschedulable_accepted_and_the_queue_moves(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    await ready_nodes(bus, {"n1": (1, "r1"), "n2": (1, "r1")})  # 2 GPUs today
    log = tmp_path / "scheduler.log"
    proc = start_service("scheduler", [], nats_url, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    kv = await bus.kv("jobs")

    async def record(job: str) -> dict[str, Any]:
        return json.loads((await kv.get(job)).value)

    async def submit(path: Path) -> Any:
        return await asyncio.to_thread(run_cli, "submit", str(path), env=env, cwd=tmp_path)

    try:
        await until(lambda: bus.request(ADMISSION.subject, {"spec": JobSpec(
            name="probe", workers=1, gpus_per_worker=1, command=["x"]).model_dump(
            mode="json")}, timeout_s=1), "the scheduler leader to answer admission")

        # Never: no GPUs per worker. Refused before an id exists.
        zero = job_file(tmp_path, "zero", f"workers: 1\ngpus_per_worker: 0\ncommand: {SLEEP}\n")
        out = await submit(zero)
        assert out.returncode == 1 and out.stdout == ""
        assert f"{zero}: line 3, field gpus_per_worker: refused: gpus_per_worker is 0" \
            in out.stderr
        assert "Traceback" not in out.stderr
        # Never: units that do not divide the workers (field named, even when the fix is there).
        odd = job_file(tmp_path, "odd", "workers: 3\ngpus_per_worker: 1\nunit_workers: 2\n"
                                        "command: [x]\n")
        out = await submit(odd)
        assert out.returncode == 1 and out.stdout == ""
        assert "line 4, field unit_workers: refused: workers (3) is not a multiple" in out.stderr

        # Not now: 3 GPUs on a 2-GPU cluster. Accepted, unschedulable, at the FIFO head.
        cmd = json.dumps(SLEEP).replace("{s}", "1")
        wide = job_file(tmp_path, "wide", f"workers: 3\ngpus_per_worker: 1\ncommand: {cmd}\n")
        out = await submit(wide)
        assert out.returncode == 0, out.stderr
        wide_id = out.stdout.strip()
        assert wide_id.startswith("wide-") and "accepted as unschedulable" in out.stderr

        async def unschedulable() -> dict[str, Any] | None:
            r = await record(wide_id)
            return r if r["code"] == "unschedulable" else None

        r = await until(unschedulable, "the wide job to be marked unschedulable")
        assert r["status"] == "pending"
        assert "needs 3 MI300X GPUs; the registered MI300X nodes can give at most 2" in r["reason"]
        text = (await asyncio.to_thread(run_cli, "explain", wide_id, env=env)).stdout
        assert "unschedulable: needs 3 MI300X GPUs" in text and "does not hold up" in text

        # The job behind it in the same FIFO workspace still runs.
        small = job_file(tmp_path, "small", f"workers: 2\ngpus_per_worker: 1\ncommand: {cmd}\n")
        out = await submit(small)
        assert out.returncode == 0 and out.stderr == "", out.stderr
        small_id = out.stdout.strip()

        async def done(job: str) -> bool:
            return (await record(job))["status"] == "completed"

        await until(lambda: done(small_id), "the job behind the unschedulable one to run")

        # An event from elsewhere that can never run ends failed at once.
        bad = JobSpec(name="elsewhere", workers=1, gpus_per_worker=1, workspace="research",
                      command=["x"], workdir=str(ROOT))
        await bus.publish(JobSubmitted(source="test", job="elsewhere",
                                       data=JobSubmittedData(spec=bad)))

        async def failed() -> dict[str, Any] | None:
            r = await record("elsewhere")
            return r if r["status"] == "failed" else None

        r = await until(failed, "the never-runnable event's job to fail")
        assert r["code"] == "refused" and "unknown workspace 'research'" in r["reason"]
        # The record is saved before the event goes out: the event may trail it.
        msg = await until(lambda: bus.js.get_last_msg("CONTROL", "safe.job.elsewhere.failed"),
                          "the job.failed event")
        assert "unknown workspace 'research'" in json.loads(msg.data)["data"]["reason"]

        # The cluster grows: the unschedulable job is admitted and runs.
        await ready_nodes(bus, {"n3": (1, "r2")})
        await until(lambda: done(wide_id), "the once-unschedulable job to run", timeout=60)
    finally:
        code = await asyncio.to_thread(stop_process, proc, log)
        reap_all(tmp_path / "state")
    assert code == 0

    # No scheduler answering: submit goes anyway, and says so.
    out = await submit(small)
    assert out.returncode == 0 and out.stdout.strip().startswith("small-")
    assert "no scheduler answered within 2 s; submitting anyway" in out.stderr
