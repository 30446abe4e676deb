"""The bootstrap service against a real NATS: re-applying an edited hosts
file emits only the differences, a removed node is drained before it goes,
and a provisioned cluster's nodes wait for Kubespray before preflight."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nats.js.errors import KeyNotFoundError

from libs.bus import Bus
from libs.events import NodeProvisioned, NodeProvisionedData, parse_event
from libs.inventory import HostsFile, HostSpec, local_hosts
from libs.settings import Settings
from services.bootstrap.app import Bootstrap
from tests.bootstrap.kubespray_dir import kubespray_args, release_files
from tests.helpers import job_record


async def events(bus: Bus, subject: str = "safe.node.>") -> list[tuple[str, str, str]]:
    """(type, node, state) of every node event so far, in order."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while True:
            msg = await sub.next_msg(timeout=1.0)
            ev = parse_event(msg.data)
            out.append((ev.type, ev.node or "", getattr(ev.data, "state", "")))
    except Exception:
        return out
    finally:
        await sub.unsubscribe()


async def until(check: Callable[[], Any], timeout: float = 10) -> None:
    for _ in range(int(timeout * 10)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not met in time")


async def test_reapply_emits_only_differences_and_drains_before_removing(
        bus: Bus, tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    first = local_hosts(3)
    service = Bootstrap(settings, first, drain_poll_s=0.1)
    await service.start(bus)
    try:
        before = await events(bus)
        assert [e for e in before if e[0] == "node.registered"] == [
            ("node.registered", f"node-{i}", "") for i in (1, 2, 3)]
        assert ("node.state", "node-1", "preflight") in before

        jobs = await bus.kv("jobs")
        await jobs.put("j-1", job_record("j-1", "running", "node-3"))
        edited = HostsFile(cluster="embedded", nodes=[
            first.nodes[0], first.nodes[1].model_copy(update={"gpu_count": 2})])
        await service.apply(edited)
        after = (await events(bus))[len(before):]
        assert after == [("node.registered", "node-2", ""),  # changed: re-proven
                         ("node.state", "node-2", "preflight"),
                         ("node.state", "node-3", "draining")]  # removed: drained first
        await asyncio.sleep(0.5)
        nodes = await bus.kv("nodes")
        assert json.loads((await nodes.get("node-3")).value)["state"] == "draining"  # job runs

        await jobs.put("j-1", job_record("j-1", "pending"))

        async def removed() -> bool:
            try:
                await nodes.get("node-3")
                return False
            except KeyNotFoundError:
                return True
        await until(removed)
        assert ("node.removed", "node-3", "") in await events(bus)
        assert "node-3" not in service.nodes

        count = len(await events(bus))
        await service.apply(edited)  # unchanged: nothing at all
        assert len(await events(bus)) == count
    finally:
        await service.stop()


async def test_provisioned_nodes_wait_for_kubespray_before_preflight(
        bus: Bus, tmp_path: Path) -> None:
    hosts = HostsFile(cluster="lab", provision=True, nodes=[
        HostSpec(name="cp-1", ip="10.0.0.1", roles=["control-plane", "etcd", "worker"],
                 gpu_model="MI300X", gpu_count=8)])
    service = Bootstrap(Settings(state_dir=tmp_path), hosts)
    await service.start(bus)
    try:
        assert service.nodes["cp-1"].state == "provisioning"
        assert not [e for e in await events(bus, "safe.bench.>")]  # no bench yet
        await bus.publish(NodeProvisioned(source="test", node="cp-1",
                                          data=NodeProvisionedData(ok=False, reason="ssh")))

        async def state_is(state: str) -> bool:
            return service.nodes["cp-1"].state == state
        await until(lambda: state_is("quarantined"))
        assert not [e for e in await events(bus, "safe.bench.>")]
        await bus.publish(NodeProvisioned(source="test", node="cp-1",
                                          data=NodeProvisionedData(ok=True)))  # a fixed re-run
        await until(lambda: state_is("preflight"))
        states = [e[2] for e in await events(bus) if e[0] == "node.state"]
        assert states == ["provisioning", "quarantined", "provisioning", "provisioned",
                          "preflight"]
        assert [e[0] for e in await events(bus, "safe.bench.>")] == ["bench.request"]
    finally:
        await service.stop()


async def test_apply_publish_tells_the_service(
        bus: Bus, nats_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    import sys

    import yaml

    from tests.helpers import run_cli

    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"cluster": "lab", "provision": True, "nodes": [
        {"name": "cp-1", "ip": "10.0.0.1", "roles": ["control-plane", "etcd", "worker"],
         "gpu_model": "cpu", "gpu_count": 0}]}))
    kubespray = release_files(tmp_path / "ks")
    (kubespray / "cluster.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.ping:\n")
    env = {**cli_env, "PRIMUS_NATS_URL": nats_url}
    result = run_cli("bootstrap", "apply", str(path), "--out", str(tmp_path / "out"),
                     *kubespray_args(kubespray), "--publish", "-e", "ansible_connection=local",
                     "-e", f"ansible_python_interpreter={sys.executable}", env=env, timeout=240)
    assert result.returncode == 0, result.stderr + result.stdout
    assert ("node.provisioned", "cp-1", "") in await events(bus)


async def test_kubespray_removal_waits_for_the_drain_and_for_remove_node(
        bus: Bus, tmp_path: Path) -> None:
    """Handed a file with remove_with=kubespray, bootstrap drains the node but
    keeps it (still a Kubernetes node) until asked to remove it; it refuses
    while a job still runs there."""
    from services.bootstrap.protocol import APPLY, REMOVE

    first = local_hosts(2)
    service = Bootstrap(Settings(state_dir=tmp_path), first, drain_poll_s=0.1)
    await service.start(bus)
    try:
        jobs = await bus.kv("jobs")
        await jobs.put("j-1", job_record("j-1", "running", "node-2"))
        edited = HostsFile(cluster="embedded", nodes=[first.nodes[0]])
        reply = await bus.request(APPLY.subject, {"hosts": edited.model_dump(mode="json"),
                                                  "remove_with": "kubespray"})
        assert reply == {"ok": True, "error": None, "changes": [
            {"node": "node-2", "action": "remove", "fields": []}]}
        refused = await bus.request(REMOVE.subject, {"nodes": ["node-2"]})
        assert not refused["ok"] and "not drained" in refused["refused"]["node-2"]

        await jobs.put("j-1", job_record("j-1", "completed"))

        async def drained() -> bool:
            return bool(service.nodes["node-2"].drained)
        await until(drained)
        await asyncio.sleep(0.5)
        assert "node-2" in service.nodes  # drained, not removed: remove-node.yml comes first
        assert ("node.removed", "node-2", "") not in await events(bus)

        reply = await bus.request(REMOVE.subject, {"nodes": ["node-2"], "reason": "kubespray"})
        assert reply == {"ok": True, "error": None, "removed": ["node-2"], "refused": {}}
        assert ("node.removed", "node-2", "") in await events(bus)
        again = await bus.request(REMOVE.subject, {"nodes": ["node-2"]})
        assert again["ok"]  # a retried request is fine
    finally:
        await service.stop()


async def test_a_node_never_provisioned_leaves_without_kubespray(
        bus: Bus, tmp_path: Path) -> None:
    from services.bootstrap.protocol import APPLY

    cp = HostSpec(name="cp-1", ip="10.0.0.1", roles=["control-plane", "etcd"],
                  gpu_model="cpu", gpu_count=0)
    w = HostSpec(name="w-1", ip="10.0.0.2", gpu_model="MI300X", gpu_count=8)
    service = Bootstrap(Settings(state_dir=tmp_path),
                        HostsFile(cluster="lab", provision=True, nodes=[cp, w]),
                        drain_poll_s=0.1)
    await service.start(bus)
    try:
        assert service.nodes["w-1"].state == "provisioning"
        edited = HostsFile(cluster="lab", provision=True, nodes=[cp])
        await bus.request(APPLY.subject, {"hosts": edited.model_dump(mode="json"),
                                          "remove_with": "kubespray"})

        async def gone() -> bool:
            return "w-1" not in service.nodes
        await until(gone)  # no remove-node.yml: it never joined Kubernetes
        assert ("node.removed", "w-1", "") in await events(bus)
    finally:
        await service.stop()


async def test_a_restart_keeps_the_hosts_file_last_handed_over(bus: Bus, tmp_path: Path) -> None:
    from services.bootstrap.protocol import APPLY

    cp = HostSpec(name="cp-1", ip="10.0.0.1", roles=["control-plane", "etcd"],
                  gpu_model="cpu", gpu_count=0)
    w1 = HostSpec(name="w-1", ip="10.0.0.2", gpu_model="MI300X", gpu_count=8)
    w2 = HostSpec(name="w-2", ip="10.0.0.3", gpu_model="MI300X", gpu_count=8)
    boot = HostsFile(cluster="lab", provision=True, nodes=[cp, w1])
    service = Bootstrap(Settings(state_dir=tmp_path), boot, drain_poll_s=0.1)
    await service.start(bus)
    edited = HostsFile(cluster="lab", provision=True, nodes=[cp, w2])  # w-1 out, w-2 in
    try:
        reply = await bus.request(APPLY.subject, {"hosts": edited.model_dump(mode="json"),
                                                  "remove_with": None})
        assert reply["ok"]

        async def swapped() -> bool:
            return "w-1" not in service.nodes and "w-2" in service.nodes
        await until(swapped)
    finally:
        await service.stop()

    # Restarted with the same boot file: the edit stands, w-1 is not back.
    again = Bootstrap(Settings(state_dir=tmp_path), boot, drain_poll_s=0.1)
    await again.start(bus)
    try:
        assert again.hosts == edited
        assert "w-1" not in again.nodes and again.nodes["w-2"].state != "draining"
    finally:
        await again.stop()

    # A new boot file (a new release of the chart) is the newer word.
    w3 = HostSpec(name="w-3", ip="10.0.0.4", gpu_model="MI300X", gpu_count=8)
    release = HostsFile(cluster="lab", provision=True, nodes=[cp, w2, w3])
    newest = Bootstrap(Settings(state_dir=tmp_path), release, drain_poll_s=0.1)
    await newest.start(bus)
    try:
        assert newest.hosts == release and "w-3" in newest.nodes
    finally:
        await newest.stop()


async def test_a_drain_outlives_a_failing_read_of_the_jobs(bus: Bus, tmp_path: Path) -> None:
    """A drain can last hours. A read of the jobs bucket that fails on the
    way (here the bucket is gone for a while) is tried again, and the node
    is still removed once nothing runs there."""
    hosts = local_hosts(2)
    service = Bootstrap(Settings(state_dir=tmp_path), hosts, drain_poll_s=0.1)
    await service.start(bus)
    try:
        jobs = await bus.kv("jobs")
        await jobs.put("j-1", job_record("j-1", "running", "node-2"))
        await service.apply(HostsFile(cluster="embedded", nodes=[hosts.nodes[0]]))
        await asyncio.sleep(0.5)
        assert service.nodes["node-2"].state == "draining"  # its job runs

        await bus.js.delete_key_value("jobs")
        await asyncio.sleep(1.0)  # every poll meanwhile fails
        assert service.nodes["node-2"].state == "draining"
        await bus.ensure_topology()  # back, and empty: nothing runs on node-2 now

        async def removed() -> bool:
            return "node-2" not in service.nodes
        await until(removed, timeout=30)
        assert ("node.removed", "node-2", "") in await events(bus)
    finally:
        await service.stop()
