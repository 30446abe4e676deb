"""The chart's security wiring: per-service NATS users and TLS, rendered by
the real helm and run on a real nats-server; no secret as a plain value."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from deploy_helpers import Renderer, by_kind, workloads
from pki import make_pki

from cli.catalog import NATS_USERS, ROLE_NAMES
from libs.bus import Bus
from libs.drivers.local import free_port
from libs.embedded import nats_server_binary, wait_for_port
from libs.job_credentials import issuer_public_key
from libs.nats_permissions import CALLOUT_ISSUER_ENV, password_env

NATS = "primus-primus-safe-nats"
SECRET = "primus-primus-safe-credentials"
TLS_VALUES = {"nats": {"tls": {"enabled": True, "secretName": "nats-tls",
                               "verifyClients": True}}}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|DSN|SECRET_KEY", re.IGNORECASE)


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def env_of(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (container,) = containers(obj)
    return {e["name"]: e for e in container.get("env", [])}


def nats_conf(objects: list[dict[str, Any]]) -> str:
    return by_kind(objects, "ConfigMap")[NATS]["data"]["nats.conf"]


@pytest.mark.parametrize("values", [{}, {"nats": {"auth": {"mode": "token"}}}, TLS_VALUES],
                         ids=["users", "token", "tls"])
def test_no_secret_is_a_plain_value(render: Renderer, values: dict[str, Any]) -> None:
    for obj in render(values):
        if obj["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        for container in containers(obj):
            for env in container.get("env", []):
                if SECRET_NAME.search(env["name"]) and "_SECRET" not in env["name"]:
                    assert "value" not in env, (obj["metadata"]["name"], env["name"])
                    assert "secretKeyRef" in env["valueFrom"], env


def test_each_service_signs_in_as_its_own_user(render: Renderer) -> None:
    objects = render()
    for verb, workload in workloads(objects).items():
        env = env_of(workload)
        assert verb in ROLE_NAMES
        assert env["PRIMUS_NATS_USER"]["value"] == verb
        assert env["PRIMUS_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": SECRET, "key": f"nats-password-{verb}"}
        assert "PRIMUS_NATS_TOKEN" not in env
    server = env_of(by_kind(objects, "StatefulSet")[NATS])
    for name in NATS_USERS:
        assert server[password_env(name)]["valueFrom"]["secretKeyRef"] == {
            "name": SECRET, "key": f"nats-password-{name}"}
    assert "NATS_PASSWORD_TRAINER" not in server
    # No unauthenticated user: every other login goes to the scheduler's
    # auth callout (job credentials), whose keys it reads from the Secret.
    scheduler = env_of(workloads(objects)["scheduler"])
    assert "PRIMUS_K8S_NATS_TOKEN_SECRET" not in scheduler
    for var, key in (("PRIMUS_JOB_CREDENTIAL_KEY", "job-credential-key"),
                     ("PRIMUS_NATS_CALLOUT_SEED", "nats-callout-seed")):
        assert scheduler[var]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": key}
        for verb, workload in workloads(objects).items():
            assert verb == "scheduler" or var not in env_of(workload)
    conf = nats_conf(objects)
    assert "no_auth_user" not in conf and '"trainer"' not in conf
    assert "auth_callout {" in conf and "issuer: $NATS_CALLOUT_ISSUER" in conf
    nats = by_kind(objects, "StatefulSet")[NATS]["spec"]["template"]["spec"]
    assert "NATS_CALLOUT_ISSUER=$(cat /var/run/nats/callout-issuer)" in \
        nats["containers"][0]["command"][-1]
    init = nats["initContainers"][0]
    assert init["env"][0]["valueFrom"]["secretKeyRef"] == {
        "name": SECRET, "key": "nats-callout-seed"}


def test_token_mode_shares_one_token(render: Renderer) -> None:
    objects = render({"nats": {"auth": {"mode": "token"}}})
    for workload in workloads(objects).values():
        env = env_of(workload)
        assert env["PRIMUS_NATS_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "nats-token"
        assert "PRIMUS_NATS_USER" not in env
    assert env_of(workloads(objects)["scheduler"])["PRIMUS_K8S_NATS_TOKEN_SECRET"]["value"] \
        == SECRET
    assert "users = [" not in nats_conf(objects) and "token: $NATS_TOKEN" in nats_conf(objects)


def test_tls_mounts_the_secret_and_points_the_services_at_it(render: Renderer) -> None:
    objects = render(TLS_VALUES)
    conf = nats_conf(objects)
    block = conf[conf.index("tls {"):]
    for line in ("cert_file: /etc/nats/tls/tls.crt", "key_file: /etc/nats/tls/tls.key",
                 "ca_file: /etc/nats/tls/ca.crt", "verify: true"):
        assert line in block
    sts = by_kind(objects, "StatefulSet")[NATS]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "nats-tls"
    for verb, workload in workloads(objects).items():
        env = env_of(workload)
        files = {env[f"PRIMUS_NATS_TLS_{k}"]["value"] for k in ("CA", "CERT", "KEY")}
        assert files == {f"/etc/primus-safe/nats-tls/{f}" for f in ("ca.crt", "tls.crt", "tls.key")}
        spec = workload["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "nats-tls"]
        assert volume["secret"]["secretName"] == "nats-tls", verb
    # Without client verification the services get the CA only.
    one_way = render({"nats": {"tls": {"enabled": True, "secretName": "nats-tls"}}})
    for workload in workloads(one_way).values():
        env = env_of(workload)
        assert "PRIMUS_NATS_TLS_CA" in env and "PRIMUS_NATS_TLS_CERT" not in env
        (volume,) = [v for v in workload["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "nats-tls"]
        assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt"]  # not the server key
    assert "verify: false" in nats_conf(one_way)


def _runnable(conf: str, tmp_path: Path, port: int, pki: dict[str, Path]) -> str:
    """The chart's nats.conf with this machine's port, store and certificate paths."""
    conf = conf.replace("port: 4222", f"port: {port}\nhost: 127.0.0.1")
    conf = conf.replace("http_port: 8222\n", "").replace("store_dir: /data",
                                                        f"store_dir: {json.dumps(str(tmp_path))}")
    conf = conf.replace("/var/run/nats/nats.pid", str(tmp_path / "nats.pid"))
    for chart_path, local in (("/etc/nats/tls/tls.crt", pki["server"]),
                              ("/etc/nats/tls/tls.key", pki["server_key"]),
                              ("/etc/nats/tls/ca.crt", pki["ca"])):
        conf = conf.replace(chart_path, str(local))
    return conf


def test_the_rendered_server_config_works_for_real(render: Renderer, tmp_path: Path) -> None:
    """The chart's own nats.conf (users + mutual TLS) on a real nats-server:
    a service signs in with its password and certificate and declares the
    topology; the bench agent's user is refused a job subject."""
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    path = tmp_path / "nats.conf"
    path.write_text(_runnable(nats_conf(render(TLS_VALUES)), tmp_path, port, pki))
    passwords = {name: "p" + secrets.token_hex(12) for name in NATS_USERS}
    env = {**os.environ, "POD_NAME": "nats-0",
           **{password_env(name): pw for name, pw in passwords.items()},
           CALLOUT_ISSUER_ENV: issuer_public_key("test")}
    log = (tmp_path / "nats.log").open("wb")
    proc = subprocess.Popen([nats_server_binary(), "-c", str(path)], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        try:
            wait_for_port(port)
        except TimeoutError:
            pytest.fail((tmp_path / "nats.log").read_text()[-2000:])
        asyncio.run(_sign_in(f"nats://127.0.0.1:{port}", passwords, pki))
    finally:
        proc.terminate()
        proc.wait(10)


async def _sign_in(url: str, passwords: dict[str, str], pki: dict[str, Path]) -> None:
    tls = {"tls_ca": pki["ca"], "tls_cert": pki["client"], "tls_key": pki["client_key"]}
    scheduler = await Bus.connect(url, "scheduler", user="scheduler",
                                  password=passwords["scheduler"], **tls)
    try:
        await scheduler.ensure_topology()
        assert (await scheduler.js.publish("safe.job.j1.placed", b"{}", timeout=10)).seq == 1
    finally:
        await scheduler.close()
    agent = await Bus.connect(url, "bench-agent", user="bench-agent",
                              password=passwords["bench-agent"], **tls)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await agent.js.publish("safe.job.j1.placed", b"{}", timeout=1)
    finally:
        await agent.close()
    with pytest.raises(ConnectionError):  # a password of another user
        await Bus.connect(url, "bench-agent", user="bench-agent",
                          password=passwords["scheduler"], timeout_s=3, **tls)


def test_the_rendered_cluster_forms_a_jetstream_cluster(
    render: Renderer, tmp_path: Path
) -> None:
    """nats.cluster.enabled: three real nats-servers, each from the chart's own
    nats.conf (its routes pointed at this machine), elect a JetStream meta
    leader and route to each other; a service signed in to one server
    declares the topology and publishes; another service on another server
    reads the same streams."""
    conf = nats_conf(render({"nats": {"cluster": {"enabled": True}}}))
    ports = [(free_port(), free_port(), free_port()) for _ in range(3)]  # client, http, route
    for i, (_, _, route) in enumerate(ports):
        chart_route = f"nats://{NATS}-{i}.{NATS}-headless.primus-system.svc:6222"
        assert chart_route in conf  # every peer, through the headless Service
        conf = conf.replace(chart_route, f"nats://127.0.0.1:{route}")
    passwords = {name: "p" + secrets.token_hex(12) for name in NATS_USERS}
    procs = []
    try:
        for i, (client, http, route) in enumerate(ports):
            home = tmp_path / f"nats-{i}"
            home.mkdir()
            mine = (conf.replace("port: 4222", f"port: {client}\nhost: 127.0.0.1")
                    .replace("http_port: 8222", f"http_port: {http}")
                    .replace("  port: 6222", f"  port: {route}\n      host: 127.0.0.1")
                    .replace("store_dir: /data", f"store_dir: {json.dumps(str(home))}")
                    .replace("/var/run/nats/nats.pid", str(home / "nats.pid")))
            (home / "nats.conf").write_text(mine)
            env = {**os.environ, "POD_NAME": f"nats-{i}",
                   **{password_env(name): pw for name, pw in passwords.items()},
                   CALLOUT_ISSUER_ENV: issuer_public_key("test")}
            log = (home / "nats.log").open("wb")
            procs.append(subprocess.Popen([nats_server_binary(), "-c", str(home / "nats.conf")],
                                          env=env, stdout=log, stderr=subprocess.STDOUT))
        for client, _, _ in ports:
            wait_for_port(client)
        meta = _wait_for_meta_leader([http for _, http, _ in ports], tmp_path)
        assert meta["cluster_size"] == 3 and meta["leader"] in {"nats-0", "nats-1", "nats-2"}
        urls = [f"nats://127.0.0.1:{client}" for client, _, _ in ports]
        leader = asyncio.run(_across_servers(urls, passwords))
        # The stream's leader goes; its two copies elsewhere keep the event.
        procs[int(leader.rsplit("-", 1)[1])].kill()
        asyncio.run(_survives(urls, passwords, leader))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def _wait_for_meta_leader(http_ports: list[int], tmp_path: Path) -> dict[str, Any]:
    """/jsz of every server until they agree on a JetStream meta leader and
    each routes to both peers."""
    import time
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            jsz = [json.load(urllib.request.urlopen(f"http://127.0.0.1:{p}/jsz", timeout=2))
                   for p in http_ports]
            routez = [json.load(urllib.request.urlopen(f"http://127.0.0.1:{p}/routez", timeout=2))
                      for p in http_ports]
        except OSError:
            time.sleep(0.5)
            continue
        leaders = {(j.get("meta_cluster") or {}).get("leader") for j in jsz}
        if len(leaders) == 1 and None not in leaders and "" not in leaders and all(
            r["num_routes"] >= 2 for r in routez
        ):
            return jsz[0]["meta_cluster"]
        time.sleep(0.5)
    logs = "\n".join((tmp_path / f"nats-{i}" / "nats.log").read_text()[-800:] for i in range(3))
    pytest.fail(f"no JetStream meta leader within 60 s:\n{logs}")


async def _across_servers(urls: list[str], passwords: dict[str, str]) -> str:
    """Declares the topology with three copies (as the chart's
    PRIMUS_NATS_REPLICAS says), publishes, reads on another server; the
    name of CONTROL's leader."""
    scheduler = await Bus.connect(urls[0], "scheduler", user="scheduler",
                                  password=passwords["scheduler"])
    try:
        await scheduler.ensure_topology(3)
        ack = await scheduler.js.publish("safe.job.j1.placed", b"{}", timeout=10)
        assert ack.stream == "CONTROL" and ack.seq == 1
    finally:
        await scheduler.close()
    failover = await Bus.connect(urls[2], "failover", user="failover",
                                 password=passwords["failover"])
    try:
        info = await failover.js.stream_info("CONTROL")
        assert info.state.messages == 1 and info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader
        assert len(info.cluster.replicas or []) == 2
        return info.cluster.leader
    finally:
        await failover.close()


async def _survives(urls: list[str], passwords: dict[str, str], gone: str) -> None:
    """After the stream's leader died: a new leader, and the event is there."""
    alive = [u for i, u in enumerate(urls) if f"nats-{i}" != gone]
    failover = await Bus.connect(alive[0], "failover", user="failover",
                                 password=passwords["failover"])
    try:
        for _ in range(60):
            try:
                info = await failover.js.stream_info("CONTROL")
                if info.cluster is not None and info.cluster.leader not in (None, gone):
                    break
            except nats.errors.Error:
                pass
            await asyncio.sleep(0.5)
        else:
            pytest.fail("CONTROL found no new leader within 30 s")
        assert info.state.messages == 1
    finally:
        await failover.close()
