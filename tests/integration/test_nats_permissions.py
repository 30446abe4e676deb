"""The generated per-service NATS users on a real nats-server: every service
can do what the table says through the real Bus (declare the topology,
consume, ack, dead-letter, read and write its buckets, serve and call), and
a bench agent is refused what belongs to the scheduler. Also TLS: Bus.connect
through a CA it trusts, with and without a client certificate."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import api
from nats.js.errors import KeyNotFoundError
from pydantic import BaseModel, ConfigDict

from cli.catalog import NATS_USERS, ROLES, role
from libs.bus import KV_BUCKETS, Bus
from libs.drivers.local import free_port
from libs.embedded import nats_server_binary, wait_for_port
from libs.events import (
    BenchResult,
    BenchResultData,
    Event,
    HeartbeatData,
    NodeHeartbeat,
    encode_event,
)
from libs.leader import LEASES_BUCKET, LeaderElection
from libs.nats_permissions import password_env, render_users
from libs.routes import Empty, Endpoint, Reply, Routes, event_subject, health_endpoint
from libs.topology import stream_of
from tests.deploy.pki import make_pki
from tests.helpers import terminate

ADMIN = "admin"  # the test's own eyes: sees and seeds everything


def concrete(pattern: str, key: str = "n1") -> str:
    """A subject that matches ``pattern`` (wildcards filled in)."""
    return ".".join(key if t == "*" else ("x" if t == ">" else t) for t in pattern.split("."))


@dataclass
class SecuredNats:
    url: str
    passwords: dict[str, str]
    proc: subprocess.Popen[bytes]


def _start(conf: str, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    path = tmp_path / "nats.conf"
    path.write_text(conf)
    log = (tmp_path / "nats.log").open("ab")
    return subprocess.Popen([nats_server_binary(), "-c", str(path)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, **env})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    terminate(proc)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    """A nats-server whose only users are the generated ones (passwords from
    the environment, as in the chart) plus an unrestricted test admin;
    no unauthenticated user (jobs log in through the auth callout:
    tests/integration/test_job_credentials.py)."""
    port = free_port()
    # nats-server parses an environment value as a config value: one that
    # starts with a digit reads as a number, so passwords start with a letter.
    passwords = {n: "p" + secrets.token_hex(16) for n in (*NATS_USERS, ADMIN)}
    users = render_users(ROLES).replace(
        "users = [\n",
        f'users = [\n  {{user: "{ADMIN}", password: ${password_env(ADMIN)}}}\n', 1)
    store = json.dumps(str(tmp_path / "js"))
    conf = (f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {store} }}\n"
            f"authorization {{\n{users}}}\n")
    proc = _start(conf, tmp_path, {password_env(n): p for n, p in passwords.items()})
    try:
        wait_for_port(port)
    except TimeoutError:
        _stop(proc)
        pytest.fail((tmp_path / "nats.log").read_text()[-2000:])
    yield SecuredNats(f"nats://127.0.0.1:{port}", passwords, proc)
    _stop(proc)


async def _as(server: SecuredNats, name: str) -> Bus:
    return await Bus.connect(server.url, name, user=name, password=server.passwords[name])


@pytest.fixture
async def admin(secured: SecuredNats) -> AsyncIterator[Bus]:
    bus = await _as(secured, ADMIN)
    await bus.ensure_topology()
    yield bus
    await bus.close()


async def _until(check, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def _exercise(r: Routes, secured: SecuredNats, admin: Bus) -> None:
    """Everything the table names, done through the real Bus as the role's
    user (with the table on the bus, as the services run)."""
    bus = await _as(secured, r.service)
    bus.routes = r
    try:
        if r.service_shell:
            await bus.ensure_topology()  # as libs/service.py does at start-up
            health = health_endpoint(r.service)
            await bus.serve(health, _ok)
            probe = await _as(secured, r.service)  # `primus-safe health` with the pod's user
            assert (await probe.request(health.subject, timeout_s=10))["ok"]
            await probe.close()
        # Publish every event it owns, durably (JetStream acks it); a live
        # one (a heartbeat, core NATS) must reach a listener.
        for cls in r.publishes:
            subject = concrete(event_subject(cls))
            if stream_of(subject) is None:
                heard = await admin.nc.subscribe(subject, max_msgs=1)
                await admin.flush()
                await bus.nc.publish(subject, b"{}")
                assert (await heard.next_msg(timeout=10)).data == b"{}", (r.service, cls)
                continue
            ack = await bus.js.publish(subject, b"{}", timeout=10)
            assert ack.seq > 0, (r.service, cls.__name__)
        for bucket in dict.fromkeys([*r.reads, *r.owns]):
            records = await bus.records(bucket)
            await records.load()
            if bucket in r.owns:
                kv = await bus.kv(bucket.name)
                await kv.put("probe", b"1")
                assert (await kv.get("probe")).value == b"1"
        for key in r.leases:  # the real election: take, renew, release its own key
            election = LeaderElection(bus, key, ttl_s=2, holder=f"{r.service}-test")
            await election.start()
            assert await asyncio.wait_for(election.wait_elected(), 10) > 0
            await election.stop()
            with pytest.raises(KeyNotFoundError):  # released: its delete went through
                await (await admin.kv(LEASES_BUCKET)).get(key)
        for c in r.consumes:
            durable, subjects = c.name("n1"), list(c.subjects("n1"))

            async def refuse_all(msgs):  # type: ignore[no-untyped-def]
                return [(m, "test refuses") for m in msgs]

            before = bus.stats.dead_lettered
            if c.mode == "raw":  # as the collector: its own lean connection
                bus.consume_raw(durable=durable, subjects=subjects, stream=c.stream,
                                handler=refuse_all, batch=10, fill_s=0.05)
            else:
                bus.consume(durable=durable, subjects=subjects, stream=c.stream,
                            handler=_ok, batch=10)
            # Not an event: the service dead-letters it (safe.dlq.<service>) and acks.
            await admin.js.publish(concrete(subjects[0], "n1"), b"not json")

            async def dead_lettered(before: int = before) -> bool:
                return bus.stats.dead_lettered > before

            await _until(dead_lettered)

            async def acked(durable: str = durable, stream: str = c.stream.name) -> bool:
                info = await admin.js.consumer_info(stream, durable)
                return info.num_ack_pending == 0 and info.num_pending == 0

            await _until(acked)
        for serve in r.serves:
            endpoint = serve.endpoint
            subject = concrete(endpoint.pattern)
            if endpoint.reply is None:  # one-way: it hears what is sent
                seen: asyncio.Queue[bytes] = asyncio.Queue()

                async def heard(msg, seen=seen):  # type: ignore[no-untyped-def]
                    await seen.put(msg.data)

                sub = await bus.subscribe(endpoint, heard)
                await admin.nc.publish(subject, b"{}")
                assert await asyncio.wait_for(seen.get(), 10) == b"{}"
                await sub.unsubscribe()
                continue
            served = await bus.serve(endpoint, _ok)  # the server has the SUB on return
            assert (await admin.request(subject, timeout_s=10))["ok"], subject
            await served.stop()
        for cls in r.listens:
            live: asyncio.Queue[Event] = asyncio.Queue()
            sub = await bus.listen(cls, live.put)
            await admin.nc.publish(concrete(event_subject(cls)), b"not an event")  # skipped
            sample = LIVE_SAMPLES[cls]  # a KeyError: give the new listened event a sample
            await admin.nc.publish(sample.subject, encode_event(sample))
            assert await asyncio.wait_for(live.get(), 10) == sample  # heard, nothing before
            await sub.unsubscribe()
        for cls in r.rereads:  # lookups the server lets through (answers, not refusals)
            assert await bus.stored(cls, node="n-none", job="j-none") is False
            assert await bus.stored_after(cls, 0, node="n-none", job="j-none") == []
        for endpoint in r.calls:
            target = concrete(endpoint.pattern)
            served = await admin.serve(Endpoint(target, Empty, Reply, "test"), _ok)
            assert (await bus.request(target, {}, timeout_s=10))["ok"]
            await served.stop()
    finally:
        await bus.close()


# One event of each class a role listens to live, as its sender would publish it.
LIVE_SAMPLES: dict[type[Event], Event] = {
    NodeHeartbeat: NodeHeartbeat(source="test", node="n1",
                                 data=HeartbeatData(seq=1, pid=1, interval_s=1.0)),
    BenchResult: BenchResult(source="test", node="n1", data=BenchResultData(
        level="quick", passed=True, device="cpu", device_count=1, duration_s=0.1)),
}


async def _ok(_: object) -> Reply:
    return Reply()


class _Anything(BaseModel):
    model_config = ConfigDict(extra="allow")


@pytest.mark.parametrize("name", NATS_USERS)
async def test_each_service_user_can_do_its_work(name: str, secured: SecuredNats,
                                                 admin: Bus) -> None:
    table = role(name)
    # Requests of any shape: the test asks with an empty body.
    table = replace(table, serves=tuple(
        replace(s, endpoint=replace(s.endpoint, request=_Anything)) for s in table.serves))
    await _exercise(table, secured, admin)


async def test_a_flush_returns_after_the_server_has_the_subscription(
        secured: SecuredNats) -> None:
    """Bus.flush: the server's verdict on a SUB made just before is in by the
    time it returns. A subscription the bench agent may not hold makes the
    verdict visible (-ERR comes back ahead of the PONG only if the SUB reached
    the server ahead of the PING); nats-py's flush() alone sends the PING first."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    agent = await _as(secured, "bench-agent")
    agent.nc._error_cb = on_error
    try:
        for n in range(5):
            await agent.nc.subscribe(f"safe.job.j{n}.placed")
            await agent.flush()
            assert any(f"safe.job.j{n}.placed" in e for e in errors), (n, errors)
    finally:
        await agent.close()


async def test_a_bench_agent_is_refused_the_schedulers_subjects(
        secured: SecuredNats, admin: Bus) -> None:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    agent = await _as(secured, "bench-agent")
    agent.nc._error_cb = on_error  # see the server's -ERR, not only the missing ack
    try:
        await agent.ensure_topology()
        for subject in ("safe.job.x.placed", "safe.job.placed.x"):
            with pytest.raises(nats.errors.TimeoutError):
                await agent.js.publish(subject, b"{}", timeout=1)
        kv = await agent.kv("jobs")
        with pytest.raises((nats.errors.TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(kv.put("x", b"stolen"), 2)
        # Nor may it take the scheduler's leader lease.
        leases = await agent.kv(LEASES_BUCKET)
        with pytest.raises((nats.errors.TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(leases.create("scheduler", b"agent"), 2)
        # Another service's durable: neither created nor pulled from.
        with pytest.raises(nats.errors.TimeoutError):
            await agent.nc.request("$JS.API.CONSUMER.MSG.NEXT.CONTROL.scheduler", b"{}",
                                   timeout=1)
        # Its own durable name over the scheduler's events with one filter:
        # the filter is in the API subject, and one filter may only be on
        # bench requests. (Its placements consumer has several filters, which
        # travel in the body: there the server checks the name alone.)
        with pytest.raises((nats.errors.TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(agent.js.add_consumer("CONTROL", api.ConsumerConfig(
                name="bench-agent-n1", durable_name="bench-agent-n1",
                filter_subject="safe.job.*.placed")), 2)
        # Nor without a name (the filter in the body): that needs CONSUMER.CREATE.CONTROL.
        with pytest.raises((nats.errors.TimeoutError, asyncio.TimeoutError)):
            await asyncio.wait_for(agent.js.add_consumer("CONTROL", api.ConsumerConfig(
                durable_name="bench-agent-n2", filter_subject="safe.job.*.placed")), 2)
    finally:
        await agent.close()
    violations = [e.lower() for e in errors if "permissions violation" in e.lower()]
    for subject in ("safe.job.x.placed", "safe.job.placed.x", "$kv.jobs.x", "$kv.leases.scheduler",
                    "$js.api.consumer.msg.next.control.scheduler",
                    "$js.api.consumer.create.control.bench-agent-n1.safe.job.*.placed",
                    "$js.api.consumer.durable.create.control.bench-agent-n2"):
        assert any(subject in v for v in violations), (subject, errors)
    # And nothing got through: the stream and the bucket hold no such thing.
    for subject in ("safe.job.x.placed", "safe.job.placed.x"):
        with pytest.raises(nats.js.errors.NotFoundError):
            await admin.js.get_last_msg("CONTROL", subject)
    with pytest.raises(KeyNotFoundError):
        await (await admin.kv("jobs")).get("x")


async def test_a_client_without_credentials_is_refused(secured: SecuredNats) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(secured.url, connect_timeout=2, allow_reconnect=False)


async def test_a_wrong_password_is_refused(secured: SecuredNats) -> None:
    with pytest.raises((ConnectionError, nats.errors.Error)):
        await Bus.connect(secured.url, "scheduler", user="scheduler", password="wrong",
                          timeout_s=3)


async def test_a_services_log_lines_ship_as_its_own_user(secured: SecuredNats,
                                                         admin: Bus) -> None:
    """PRIMUS_LOG_SHIP (on in the chart and compose): the shipper logs in as
    the service's NATS user, the only login a service has there."""
    from libs import logs
    from libs.events import LogRecord, LogRecordData

    line = LogRecord(source="bench-agent", node="n1", data=LogRecordData(
        level="info", message="shipped as bench-agent", service="bench-agent"))
    shipper = logs.start_shipping(secured.url, None, source="bench-agent", user="bench-agent",
                                  password=secured.passwords["bench-agent"])
    try:
        assert shipper.offer(line)

        async def stored() -> bool:
            try:
                msg = await admin.js.get_last_msg("TELEMETRY", line.subject)
            except nats.js.errors.NotFoundError:
                return False
            return b"shipped as bench-agent" in msg.data

        await _until(stored)
    finally:
        await asyncio.to_thread(logs.stop_shipping)
    assert shipper.failed == 0


def test_the_buckets_the_tables_name_exist() -> None:
    names = {b.name for r in ROLES for b in (*r.reads, *r.owns)}
    assert names <= set(KV_BUCKETS)


# --------------------------------------------------------------------------- TLS


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return make_pki(tmp_path / "pki")


@pytest.mark.parametrize("verify", [False, True], ids=["server-tls", "mutual-tls"])
async def test_bus_connects_over_tls(verify: bool, pki: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()
    args = [nats_server_binary(), "-js", "-sd", str(tmp_path / "js"), "-a", "127.0.0.1",
            "-p", str(port), "--tls", "--tlscert", str(pki["server"]),
            "--tlskey", str(pki["server_key"])]
    if verify:
        args += ["--tlsverify", "--tlscacert", str(pki["ca"])]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        url = f"nats://127.0.0.1:{port}"
        client = {"tls_cert": pki["client"], "tls_key": pki["client_key"]} if verify else {}
        bus = await Bus.connect(url, "tls-test", tls_ca=pki["ca"], **client)
        try:
            await bus.ensure_topology()
            # Even the lens hot path: no lean plain-TCP connection under TLS.
            assert bus.url is None
            assert (await bus.js.publish("safe.telemetry.job.j1", b"{}")).seq == 1
        finally:
            await bus.close()
        # Without the CA the server's certificate is not trusted: refused.
        with pytest.raises((ConnectionError, nats.errors.Error, OSError)):
            await Bus.connect(url, "tls-test", timeout_s=3)
        if verify:  # without a client certificate the server refuses us
            with pytest.raises((ConnectionError, nats.errors.Error, OSError)):
                await Bus.connect(url, "tls-test", tls_ca=pki["ca"], timeout_s=3)
    finally:
        _stop(proc)


def test_tls_files_that_do_not_pair_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConnectionError, match="PRIMUS_NATS_TLS_CERT and PRIMUS_NATS_TLS_KEY"):
        asyncio.run(Bus.connect("nats://127.0.0.1:1", "x", tls_cert=tmp_path / "c.crt"))
    with pytest.raises(ConnectionError, match="PRIMUS_NATS_TLS_CA .*missing.crt"):
        asyncio.run(Bus.connect("nats://127.0.0.1:1", "x", tls_ca=tmp_path / "missing.crt"))
