"""The generated per-service NATS users on a real nats-server: every service
can do what the table says through the real Bus (declare the topology,
consume, ack, dead-letter, read and write its buckets, serve and call), and
a bench agent is refused what belongs to the scheduler. Also TLS: Bus.connect
through a CA it trusts, with and without a client certificate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import api
from nats.js.errors import KeyNotFoundError, NoKeysError

from libs.bus import KV_BUCKETS, Bus
from libs.drivers.local import free_port
from libs.embedded import nats_server_binary, wait_for_port
from libs.leader import LEASES_BUCKET, LeaderElection
from libs.nats_permissions import (
    ANY_DURABLE,
    ROLES,
    Role,
    event_subject,
    password_env,
    render_users,
    role,
)
from tests.deploy.pki import make_pki

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
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    """A nats-server whose only users are the generated ones (passwords from
    the environment, as in the chart) plus an unrestricted test admin;
    credential-less clients are the trainer (``no_auth_user``)."""
    port = free_port()
    # nats-server parses an environment value as a config value: one that
    # starts with a digit reads as a number, so passwords start with a letter.
    passwords = {n: "p" + secrets.token_hex(16) for n in (*(r.name for r in ROLES), ADMIN)}
    users = render_users().replace(
        "users = [\n",
        f'users = [\n  {{user: "{ADMIN}", password: ${password_env(ADMIN)}}}\n', 1)
    store = json.dumps(str(tmp_path / "js"))
    conf = (f"listen: 127.0.0.1:{port}\njetstream {{ store_dir: {store} }}\n"
            f"authorization {{\n{users}}}\nno_auth_user: trainer\n")
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


async def _exercise(r: Role, secured: SecuredNats, admin: Bus) -> None:
    bus = await _as(secured, r.name)
    try:
        if r.service:
            await bus.ensure_topology()  # as libs/service.py does at start-up
            health = f"safe.health.{r.name}"
            await bus.serve(health, _ok)
            probe = await _as(secured, r.name)  # `primus-safe health` with the pod's user
            assert (await probe.request(health, timeout_s=10))["ok"]
            await probe.close()
        # Publish every event it owns, durably (JetStream acks it).
        for cls in r.produces:
            ack = await bus.js.publish(concrete(event_subject(cls)), b"{}", timeout=10)
            assert ack.seq > 0, (r.name, cls.__name__)
        for bucket in r.kv_read + r.kv_write:
            kv = await bus.kv(bucket)
            with contextlib.suppress(NoKeysError):
                await kv.keys()
            if bucket in r.kv_write:
                await kv.put("probe", b"1")
                assert (await kv.get("probe")).value == b"1"
        for key in r.leases:  # the real election: take, renew, release its own key
            election = LeaderElection(bus, key, ttl_s=2, holder=f"{r.name}-test")
            await election.start()
            assert await asyncio.wait_for(election.wait_elected(), 10) > 0
            await election.stop()
            with pytest.raises(KeyNotFoundError):  # released: its delete went through
                await (await admin.kv(LEASES_BUCKET)).get(key)
        for c in r.consumes:
            durable = f"{r.name}-n1" if c.durable == ANY_DURABLE else c.durable
            subjects = [concrete(s) for s in c.subjects] if c.durable == ANY_DURABLE \
                else list(c.subjects)

            async def refuse_all(msgs):  # type: ignore[no-untyped-def]
                return [(m, "test refuses") for m in msgs]

            before = bus.stats.dead_lettered
            if c.durable == "lens-telemetry":  # as the collector: its own lean connection
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
        for subject in r.serves:
            concrete_subject = concrete(subject)
            await bus.serve(subject, _ok)  # the server has the SUB once it returns
            assert (await admin.request(concrete_subject, timeout_s=10))["ok"], subject
        for subject in r.listens:
            seen: asyncio.Queue[bytes] = asyncio.Queue()

            async def got(msg, seen=seen):  # type: ignore[no-untyped-def]
                await seen.put(msg.data)

            sub = await bus.nc.subscribe(subject, cb=got)
            await bus.flush()
            await admin.nc.publish(concrete(subject), b"live")
            assert await asyncio.wait_for(seen.get(), 10) == b"live"
            await sub.unsubscribe()
        for subject in r.calls:
            target = concrete(subject)
            sub = await admin.serve(target, _ok)
            assert json.loads((await bus.nc.request(target, b"{}", timeout=10)).data)["ok"]
            await sub.unsubscribe()
    finally:
        await bus.close()


async def _ok(_: object) -> dict[str, bool]:
    return {"ok": True}


@pytest.mark.parametrize("name", [r.name for r in ROLES if r.name != "trainer"])
async def test_each_service_user_can_do_its_work(name: str, secured: SecuredNats,
                                                 admin: Bus) -> None:
    await _exercise(role(name), secured, admin)


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
        # Its own durable name over the scheduler's events: the filter is
        # in the API subject, and it may only filter on bench requests.
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


async def test_a_training_worker_without_credentials_may_only_report(
        secured: SecuredNats, admin: Bus) -> None:
    nc = await nats.connect(secured.url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        assert (await js.publish("safe.telemetry.job.j1", b"{}", timeout=10)).seq > 0
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("safe.job.j1.placed", b"{}", timeout=1)
    finally:
        await nc.close()


async def test_a_wrong_password_is_refused(secured: SecuredNats) -> None:
    with pytest.raises((ConnectionError, nats.errors.Error)):
        await Bus.connect(secured.url, "scheduler", user="scheduler", password="wrong",
                          timeout_s=3)


def test_the_buckets_the_table_names_exist() -> None:
    names = {b for r in ROLES for b in r.kv_read + r.kv_write}
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
