"""``bootstrap plan`` against the live cluster (the bootstrap service's
``nodes`` bucket on a real nats-server), its offline fallback, and bad input
that must have no effect at all: no playbook, no event, no file."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from libs.bus import Bus
from libs.inventory import HostsFile
from libs.settings import Settings
from services.bootstrap.app import Bootstrap
from services.bootstrap.protocol import APPLY
from services.bootstrap.provision import record_applied, write_files
from services.bootstrap.render import render
from tests.bootstrap.kubespray_dir import kubespray_args, make_kubespray
from tests.helpers import run_cli

CP = {"name": "cp-1", "ip": "10.0.0.1", "roles": ["control-plane", "etcd"],
      "gpu_model": "cpu", "gpu_count": 0}


def worker(name: str, ip: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "ip": ip, "gpu_model": "MI300X", "gpu_count": 8, **extra}


def lab(*workers: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"cluster": "lab", "provision": True, "kubernetes": {"version": "1.34.2"},
            "nodes": [CP, *workers], **changes}


LIVE = lab(worker("gpu-1", "10.0.0.11", labels={"rack": "r1"}), worker("gpu-2", "10.0.0.12"))


async def ready_service(bus: Bus, tmp_path: Path) -> Bootstrap:
    """Bootstrap knowing LIVE's nodes, all provisioned (as after an apply)."""
    service = Bootstrap(Settings(state_dir=tmp_path / "state"), HostsFile.model_validate(LIVE))
    await service.start(bus)
    for node in list(service.nodes):
        await service._set_state(node, "provision_succeeded", "provisioned")
    return service


async def all_events(bus: Bus) -> int:
    info = await bus.js.stream_info("CONTROL")
    return info.state.messages


async def test_plan_compares_with_the_nodes_bootstrap_knows(
        bus: Bus, nats_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    service = await ready_service(bus, tmp_path)
    try:
        out = tmp_path / "out"
        # The last applied file on this machine is older than the cluster:
        # it never had gpu-2 (someone applied from elsewhere).
        record_applied(HostsFile.model_validate(lab(worker("gpu-1", "10.0.0.11",
                                                           labels={"rack": "r1"}))), out)
        path = tmp_path / "hosts.yaml"
        path.write_text(yaml.safe_dump(lab(
            worker("gpu-1", "10.0.0.11", labels={"rack": "r2"}, gpu_count=4),
            worker("gpu-3", "10.0.0.13"), kubernetes={"version": "1.34.3"})))
        live_env = {**cli_env, "PRIMUS_NATS_URL": nats_url}
        result = await asyncio.to_thread(run_cli, "bootstrap", "plan", str(path), "--out",
                                         str(out), "--json", env=live_env)
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert plan["nodes"] == [
            {"node": "gpu-1", "action": "update", "fields": ["labels", "gpu_count"]},
            {"node": "gpu-3", "action": "add", "fields": []},
            {"node": "gpu-2", "action": "remove", "fields": []}]  # known live only
        assert plan["cluster"] == {"version": {"old": "1.34.2", "new": "1.34.3"}}
        assert plan["baseline"]["source"] == "live" and plan["baseline"]["nodes"] == 3

        text = (await asyncio.to_thread(run_cli, "bootstrap", "plan", str(path), "--out",
                                        str(out), env=live_env)).stdout
        assert "~ node gpu-1 (labels, gpu_count)" in text
        assert "- node gpu-2 after its jobs are moved away" in text
        assert "~ kubernetes.version: 1.34.2 -> 1.34.3" in text
        assert f"compared with the live cluster: 3 node(s) bootstrap knows at {nats_url}" in text

        offline = {**cli_env, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}
        result = await asyncio.to_thread(run_cli, "bootstrap", "plan", str(path), "--out",
                                         str(out), "--json", env=offline)
        plan = json.loads(result.stdout)
        assert [c["node"] for c in plan["nodes"]] == ["gpu-1", "gpu-3"]  # no gpu-2 here
        assert plan["baseline"]["source"] == "last-applied"
        assert plan["baseline"]["text"].startswith("offline: no NATS at nats://127.0.0.1:1; "
                                                   "compared with the last applied file")
    finally:
        await service.stop()


async def test_an_invalid_edit_has_no_effect_at_all(
        bus: Bus, nats_url: str, tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A cluster is applied and running; the edited file is invalid. apply
    (with --kubespray and --publish) must stop before any playbook, event,
    file or state change; so must the service when handed the file."""
    service = await ready_service(bus, tmp_path)
    try:
        out, record = tmp_path / "out", tmp_path / "record"
        hosts = HostsFile.model_validate(LIVE)
        files = render(hosts)
        from services.bootstrap.provision import plan_for
        write_files(out, plan_for(hosts, out)[0], files)
        record_applied(hosts, out)
        kubespray = make_kubespray(tmp_path / "kubespray", record)
        before = {p: p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}
        states = {n: r.state for n, r in service.nodes.items()}
        events = await all_events(bus)

        path = tmp_path / "hosts.yaml"  # gpu-2 goes (a real change) but cp-1 is a duplicate
        path.write_text(yaml.safe_dump(lab(worker("gpu-1", "10.0.0.1"),
                                           worker("gpu-3", "10.0.0.13", gpu_model="TPU9"))))
        result = await asyncio.to_thread(
            run_cli, "bootstrap", "apply", str(path), "--out", str(out),
            *kubespray_args(kubespray), "--publish", "-e", "ansible_connection=local",
            "-e", f"ansible_python_interpreter={sys.executable}",
            env={**cli_env, "PRIMUS_NATS_URL": nats_url}, timeout=120)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert str(path) in result.stderr and "nodes.2.gpu_model" in result.stderr

        invalid = yaml.safe_load(path.read_text())
        invalid["nodes"][2]["gpu_model"] = "MI300X"  # left: the duplicate IP only
        reply = await bus.request(APPLY.subject, {"hosts": invalid, "remove_with": "kubespray"})
        assert not reply["ok"] and "duplicate node ip '10.0.0.1'" in reply["error"]

        await asyncio.sleep(1)  # anything started would have shown by now
        assert not list(record.glob("*.json")), "no playbook may run"
        assert await all_events(bus) == events, "no event may be published"
        assert {p: p.read_text() for p in sorted(out.rglob("*")) if p.is_file()} == before
        assert {n: r.state for n, r in service.nodes.items()} == states
        assert "gpu-2" not in service._drains
    finally:
        await service.stop()
