"""The workload spec through the real CLI and scheduler on a real
nats-server (local driver): a job above its workspace's limit is refused at
submit with the file's line, the field and the limit; an accepted job's
record holds its workspace's defaults; the local driver says once what it
ignores (at submit and in ``explain``) and gives the workers the network
settings it can honour; a refused event from elsewhere ends failed."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from libs.bus import Bus
from libs.drivers.local import reap_all
from libs.events import JobSpec
from services.scheduler.protocol import ADMISSION
from tests.helpers import ready_nodes, run_cli, start_service, stop_process, until

pytestmark = pytest.mark.timeout(150)

CONFIG = """
workload:
  network: {socket_ifname: lo}
workspaces:
  - name: default
  - name: llm
    workload:
      image: registry.local/train:1.0
      resources: {cpu: "8", memory: 64Gi}
      network: {ib_hca: mlx5_0, ib_gid_index: 3}
    limits:
      memory: 128Gi
"""


async def test_limits_refuse_at_submit_defaults_fill_and_local_says_what_it_ignores(
        nats_url: str, bus: Bus, tmp_path: Path) -> None:
    await ready_nodes(bus, {"n1": (1, "r1")})
    config = tmp_path / "scheduler.yaml"
    config.write_text(CONFIG)
    log = tmp_path / "scheduler.log"
    proc = start_service("scheduler", [], nats_url, tmp_path,
                         PRIMUS_SCHEDULER_CONFIG=str(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url)
    kv = await bus.kv("jobs")

    async def submit(name: str, body: str) -> Any:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nworkspace: llm\nworkers: 1\ngpus_per_worker: 1\n{body}")
        return path, await asyncio.to_thread(run_cli, "submit", str(path), env=env,
                                             cwd=tmp_path)

    try:
        await until(lambda: bus.request(ADMISSION.subject, {"spec": JobSpec(
            name="probe", workers=1, gpus_per_worker=1, command=["x"]).model_dump(
            mode="json")}, timeout_s=1), "the scheduler leader to answer admission")

        path, out = await submit("big", "command: [x]\nresources:\n  cpu: '4'\n  memory: 1Ti\n")
        assert out.returncode == 1 and out.stdout == ""
        assert (f"{path}: line 8, field resources.memory: refused: resources.memory 1Ti is "
                "above workspace llm's limit of 128Gi per worker (limits.memory)") in out.stderr

        env_file = tmp_path / "env.json"
        dump = f"import json, os; json.dump(dict(os.environ), open({str(env_file)!r}, 'w'))"
        path, out = await submit("fits", f"command: [python, -c, {json.dumps(dump)}]\n"
                                         "volumes: [{name: data, pvc: data, mount_path: /d}]\n")
        assert out.returncode == 0, out.stderr
        job = out.stdout.strip()
        assert ("warning: the local driver ignores image, resources, volumes (honoured on "
                "Kubernetes only)") in out.stderr

        async def record() -> dict[str, Any] | None:
            entry = await kv.get(job)
            r = json.loads(entry.value)
            return r if r["status"] == "completed" else None

        r = await until(record, "the job to run to completion")
        spec = r["spec"]
        assert spec["image"] == "registry.local/train:1.0"
        assert (spec["resources"]["cpu"], spec["resources"]["memory"]) == ("8", "64Gi")
        assert r["notes"] == ["the local driver ignores image, resources, volumes (honoured on "
                              "Kubernetes only)"]
        seen = json.loads(env_file.read_text())
        assert (seen["NCCL_SOCKET_IFNAME"], seen["GLOO_SOCKET_IFNAME"], seen["NCCL_IB_HCA"],
                seen["NCCL_IB_GID_INDEX"]) == ("lo", "lo", "mlx5_0", "3")
        text = (await asyncio.to_thread(run_cli, "explain", job, env=env)).stdout
        assert text.count("note: the local driver ignores image, resources, volumes") == 1
    finally:
        code = await asyncio.to_thread(stop_process, proc, log)
        reap_all(tmp_path / "state")
    assert code == 0
