"""Removing and adding nodes for real: ``bootstrap apply --kubespray`` with
the bootstrap service on a real nats-server and the real ansible-runner on a
Kubespray-shaped checkout (tests/bootstrap/kubespray_dir.py).

A node that leaves is drained first (the scheduler's jobs move away), then
remove-node.yml runs with it still in the inventory, and only then does
bootstrap emit node.removed; a new worker joins through scale.yml limited
to it; an unreachable node is removed without a reset.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.js.errors import KeyNotFoundError

from libs.bus import Bus
from libs.events import parse_event
from libs.inventory import HostsFile
from libs.settings import Settings
from services.bootstrap.app import Bootstrap
from tests.bootstrap.kubespray_dir import clear, kubespray_args, make_kubespray, recorded
from tests.helpers import job_record, run_cli

LOCAL = ["-e", f"ansible_python_interpreter={sys.executable}"]
CP = {"name": "cp-1", "ip": "127.0.0.2", "roles": ["control-plane", "etcd"],
      "gpu_model": "cpu", "gpu_count": 0}


def worker(name: str, ip: str) -> dict[str, Any]:
    return {"name": name, "ip": ip, "gpu_model": "MI300X", "gpu_count": 8}


def lab(*workers: dict[str, Any]) -> dict[str, Any]:
    return {"cluster": "lab", "provision": True, "nodes": [CP, *workers]}


async def node_events(bus: Bus) -> list[tuple[str, str, str, float]]:
    """(type, node, state, time) of every node event so far."""
    sub = await bus.js.subscribe("safe.node.>", ordered_consumer=True)
    out = []
    try:
        while True:
            ev = parse_event((await sub.next_msg(timeout=1.0)).data)
            out.append((ev.type, ev.node or "", getattr(ev.data, "state", ""),
                        ev.time.timestamp()))
    except Exception:
        return out
    finally:
        await sub.unsubscribe()


async def until(check: Any, timeout: float = 60) -> None:
    for _ in range(int(timeout * 10)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.timeout(600)
async def test_removed_node_is_drained_then_removed_by_kubespray_then_announced(
        bus: Bus, nats_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    record = tmp_path / "record"
    kubespray = make_kubespray(tmp_path / "kubespray", record)
    out, path = tmp_path / "out", tmp_path / "hosts.yaml"
    env = {**cli_env, "PRIMUS_NATS_URL": nats_url}
    first = lab(worker("gpu-1", "127.0.0.11"), worker("gpu-2", "127.0.0.12"))
    service = Bootstrap(Settings(state_dir=tmp_path / "state"), HostsFile.model_validate(first),
                        drain_poll_s=0.2)
    await service.start(bus)

    async def apply(*extra: str) -> Any:
        return await asyncio.to_thread(
            run_cli, "bootstrap", "apply", str(path), "--out", str(out),
            *kubespray_args(kubespray), "--publish", "-e", "ansible_connection=local", *LOCAL,
            *extra,
            env=env, timeout=300)

    try:
        path.write_text(yaml.safe_dump(first))
        result = await apply()
        assert result.returncode == 0, result.stderr + result.stdout
        assert set(recorded(record, "cluster")) == {"cp-1", "gpu-1", "gpu-2"}
        clear(record)

        jobs = await bus.kv("jobs")
        await jobs.put("j-1", job_record("j-1", "running", "gpu-2"))
        path.write_text(yaml.safe_dump(lab(worker("gpu-1", "127.0.0.11"),
                                           worker("gpu-3", "127.0.0.13"))))
        plan = await asyncio.to_thread(run_cli, "bootstrap", "plan", str(path), "--out",
                                       str(out), "--json", env=env)
        assert [(c["node"], c["action"]) for c in json.loads(plan.stdout)["nodes"]] == [
            ("gpu-3", "add"), ("gpu-2", "remove")]

        # The job does not move within the deadline: nothing is removed.
        result = await apply("--drain-timeout", "2")
        assert result.returncode == 1 and "not drained after 2s (gpu-2: j-1)" in result.stderr
        assert "draining gpu-2: waiting for j-1 to move away" in result.stdout
        assert not list(record.glob("*.json")), "no playbook may run before the drain"
        assert service.nodes["gpu-2"].state == "draining"

        async def move_the_job_away() -> None:
            await asyncio.sleep(3)  # the CLI is waiting meanwhile
            assert not recorded(record, "remove-node")
            await jobs.put("j-1", job_record("j-1", "completed"))
        mover = asyncio.create_task(move_the_job_away())
        result = await apply()
        await mover
        assert result.returncode == 0, result.stderr + result.stdout
        text = result.stdout
        assert text.index("drained: gpu-2") < text.index("run: remove-node.yml")
        assert "run: scale.yml --limit gpu-3" in text, text
        assert text.index("removed: gpu-2") < text.index("run: scale.yml --limit gpu-3")

        removal = recorded(record, "remove-node")
        assert list(removal) == ["gpu-2"]  # only the leaving node, still in the inventory
        assert removal["gpu-2"]["node"] == "gpu-2" and removal["gpu-2"]["skip_confirmation"]
        assert removal["gpu-2"]["reset_nodes"] is True  # reachable: reset it
        assert "gpu-2" in removal["gpu-2"]["inventory"]
        assert list(recorded(record, "scale")) == ["gpu-3"]
        assert recorded(record, "scale")["gpu-3"]["limit"] == "gpu-3"
        assert set(recorded(record, "facts")) == {"cp-1", "gpu-1", "gpu-3"}
        assert not recorded(record, "cluster")  # no full run for one new worker

        events = await node_events(bus)
        removed_at = [t for (kind, node, _, t) in events if (kind, node) == (
            "node.removed", "gpu-2")]
        assert len(removed_at) == 1
        ran_at = (record / "remove-node-gpu-2.json").stat().st_mtime
        assert removed_at[0] >= ran_at, "node.removed must follow remove-node.yml"
        nodes = await bus.kv("nodes")
        with pytest.raises(KeyNotFoundError):
            await nodes.get("gpu-2")
        assert ("node.provisioned", "gpu-3") in {(e[0], e[1]) for e in events}
        await until(lambda: _state_is(service, "gpu-3", "preflight"))

        again = await asyncio.to_thread(run_cli, "bootstrap", "plan", str(path), "--out",
                                        str(out), env=env)
        assert again.stdout.startswith("no changes"), again.stdout
        assert "compared with the live cluster: 3 node(s)" in again.stdout
    finally:
        await service.stop()


async def _state_is(service: Bootstrap, node: str, state: str) -> bool:
    record = service.nodes.get(node)
    return record is not None and record.state == state


@pytest.mark.timeout(400)
def test_unreachable_node_is_removed_without_a_reset(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Offline: no drain is possible, so apply refuses unless told there is
    nothing to drain; the node does not answer SSH, so Kubespray deletes it
    without resetting it."""
    record = tmp_path / "record"
    kubespray = make_kubespray(tmp_path / "kubespray", record)
    out, path = tmp_path / "out", tmp_path / "hosts.yaml"
    env = {**cli_env, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}  # nothing listens there
    path.write_text(yaml.safe_dump(lab(worker("gpu-1", "127.0.0.11"))))
    # The plays themselves are local; only the reachability probe uses SSH.
    args = ["--out", str(out), *kubespray_args(kubespray), *LOCAL,
            "-e", "ansible_ssh_timeout=5"]
    result = run_cli("bootstrap", "apply", str(path), *args, env=env, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    clear(record)
    applied = (out / "inventory/lab/applied-hosts.yaml").read_text()

    path.write_text(yaml.safe_dump(lab()))
    plan = run_cli("bootstrap", "plan", str(path), "--out", str(out), env=env)
    assert "- node gpu-1 after its jobs are moved away" in plan.stdout
    assert "offline: no NATS at nats://127.0.0.1:1; compared with the last applied" in plan.stdout
    refused = run_cli("bootstrap", "apply", str(path), *args, env=env, timeout=300)
    assert refused.returncode == 1 and "--no-drain" in refused.stderr
    assert not list(record.glob("*.json"))
    assert (out / "inventory/lab/applied-hosts.yaml").read_text() == applied

    result = run_cli("bootstrap", "apply", str(path), *args, "--no-drain", env=env,
                     timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "unreachable: gpu-1 (deleted without a reset)" in result.stdout
    removal = recorded(record, "remove-node")
    assert list(removal) == ["gpu-1"]
    assert removal["gpu-1"]["reset_nodes"] is False
    assert removal["gpu-1"]["allow_ungraceful_removal"] is True
    assert not recorded(record, "cluster") and not recorded(record, "scale")
    assert "gpu-1" not in (out / "inventory/lab/hosts.yaml").read_text()
