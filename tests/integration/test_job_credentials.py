"""Per-job NATS credentials on a real nats-server with the auth callout.

The server knows only the platform's users (the generated ones, as the
chart renders them, plus a test admin); every other client goes to the
callout, answered by the scheduler's real ``AuthCallout`` connected as the
generated ``scheduler`` user. A job's credential publishes its own
telemetry and log lines (through the real SDK) and nothing else; a wrong
password, an unknown job, an ended job and no credentials at all are
refused at connect; a job that ends loses its open connection within the
credential's lifetime. A missing nats-server binary fails these tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.errors import NotFoundError

from cli.catalog import NATS_USERS, ROLES
from libs.bus import Bus
from libs.drivers.local import free_port
from libs.embedded import nats_server_binary, wait_for_port
from libs.events import JobSpec
from libs.job_credentials import credential, issuer_public_key
from libs.nats_permissions import CALLOUT_ISSUER_ENV, password_env, render_callout, render_users
from libs.records import JOBS, JobRecord
from libs.sdk import Run, job_inbox
from libs.settings import Settings
from services.scheduler.callout import AuthCallout

ADMIN = "admin"
KEY = secrets.token_hex(32)
SEED = secrets.token_hex(32)
TTL_S = 2


@dataclass
class Server:
    url: str
    passwords: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    passwords = {n: "p" + secrets.token_hex(16) for n in (*NATS_USERS, ADMIN)}
    users = render_users(ROLES).replace(
        "users = [\n", f'users = [\n  {{user: "{ADMIN}", password: ${password_env(ADMIN)}}}\n', 1)
    callout = render_callout(ROLES).replace('auth_users: [\n', f'auth_users: [\n  "{ADMIN}"\n', 1)
    conf = (f"listen: 127.0.0.1:{port}\n"
            f"jetstream {{ store_dir: {json.dumps(str(tmp_path / 'js'))} }}\n"
            f"authorization {{\n{users}{callout}}}\n")
    assert "no_auth_user" not in conf and "trainer" not in users
    (tmp_path / "nats.conf").write_text(conf)
    log = tmp_path / "nats.log"
    env = {**os.environ, CALLOUT_ISSUER_ENV: issuer_public_key(SEED),
           **{password_env(n): p for n, p in passwords.items()}}
    with log.open("ab") as out:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(tmp_path / "nats.conf")],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port(port)
    except TimeoutError:
        proc.kill()
        pytest.fail(log.read_text()[-2000:])
    yield Server(f"nats://127.0.0.1:{port}", passwords, proc, log)
    proc.terminate()
    proc.wait(10)


async def _as(server: Server, name: str) -> Bus:
    return await Bus.connect(server.url, name, user=name, password=server.passwords[name])


def _record(job: str, status: str) -> JobRecord:
    return JobRecord(id=job, submitted_at=0.0, status=status,  # type: ignore[arg-type]
                     spec=JobSpec(name=job, workers=1, command=["python", "x.py"]))


@dataclass
class World:
    admin: Bus
    scheduler: Bus
    callout: AuthCallout

    async def set_status(self, job: str, status: str) -> None:
        jobs = await self.admin.records(JOBS)
        await jobs.get(job)  # its revision, for the put
        await jobs.put(job, _record(job, status))


@pytest.fixture
async def world(server: Server) -> AsyncIterator[World]:
    admin = await _as(server, ADMIN)
    await admin.ensure_topology()
    scheduler = await _as(server, "scheduler")  # the generated user: it may answer
    settings = Settings(job_credential_key=KEY, nats_callout_seed=SEED,  # type: ignore[arg-type]
                        job_credential_ttl_s=TTL_S)
    callout = AuthCallout(settings)
    await callout.start(scheduler)
    w = World(admin, scheduler, callout)
    for job, status in (("ja", "running"), ("jb", "running"), ("jq", "pending"),
                        ("done", "completed"), ("gone", "cancelled")):
        await w.set_status(job, status)
    yield w
    await callout.stop()
    await scheduler.close()
    await admin.close()


async def _job_conn(server: Server, job: str, password: str | None = None,
                    errors: list[str] | None = None) -> nats.NATS:
    cred = credential(KEY.encode(), job)

    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(server.url, user=cred.user,
                              password=cred.password if password is None else password,
                              inbox_prefix=job_inbox(job), connect_timeout=3,
                              allow_reconnect=False, error_cb=on_error)


async def test_a_jobs_credential_publishes_its_own_telemetry_and_logs(
        server: Server, world: World) -> None:
    """Through the real SDK, as a worker does: the samples and log lines land."""
    cred = credential(KEY.encode(), "ja")
    run = Run(job="ja", rank=0, world_size=1, attempt=1, node="n1",
              checkpoint_dir=Path("/nonexistent"), checkpoint_interval=10,
              nats_url=server.url, nats_user=cred.user, nats_password=cred.password)
    try:
        run.report(1, loss=2.5)
        run.log("hello from ja")
    finally:
        await asyncio.to_thread(run.close, 15)  # the callout answers on this loop
    assert run.stats["published"] == 2 and run.stats["failed"] == 0, run.stats
    stored = await world.admin.js.get_last_msg("TELEMETRY", "safe.telemetry.job.ja")
    assert json.loads(stored.data)["job"] == "ja"
    log = await world.admin.js.get_last_msg("TELEMETRY", "safe.telemetry.log.job.ja")
    assert json.loads(log.data)["data"]["message"] == "hello from ja"
    assert world.callout.allowed >= 1


async def test_a_jobs_credential_is_refused_everything_else(
        server: Server, world: World) -> None:
    errors: list[str] = []
    nc = await _job_conn(server, "ja", errors=errors)
    js = nc.jetstream()
    try:
        assert (await js.publish("safe.telemetry.job.ja", b"{}", timeout=5)).seq > 0
        forbidden = ("safe.telemetry.job.jb", "safe.telemetry.log.job.jb", "safe.telemetry.log",
                     "safe.telemetry.node.n1", "safe.job.ja.placed", "safe.job.jb.failed",
                     "$KV.jobs.ja", "$JS.API.STREAM.INFO.TELEMETRY")
        # (Core publishes, one flush: the login lives TTL_S only.)
        for subject in forbidden:
            await nc.publish(subject, b'{"loss_nonfinite": "nan"}')
        # Nor may it listen to the platform's replies or another job's.
        await nc.subscribe("_INBOX.>")
        await nc.subscribe(f"{job_inbox('jb')}.>")
        await nc.subscribe("safe.telemetry.job.jb")
        await nc.flush()
        await asyncio.sleep(0.2)
    finally:
        await nc.close()
    violations = " ".join(e.lower() for e in errors)
    for subject in forbidden:
        assert f'publish to "{subject.lower()}"' in violations, (subject, errors)
    for subject in ("_inbox.>", f"{job_inbox('jb').lower()}.>", "safe.telemetry.job.jb"):
        assert f'subscription to "{subject}"' in violations, (subject, errors)
    for subject in forbidden[:2]:  # and nothing got through
        with pytest.raises(NotFoundError):
            await world.admin.js.get_last_msg("TELEMETRY", subject)


@pytest.mark.parametrize("case", ["wrong password", "unknown job", "ended job",
                                  "cancelled job", "another job's password"])
async def test_a_bad_credential_is_refused_at_connect(
        case: str, server: Server, world: World) -> None:
    job, password = {
        "wrong password": ("ja", "not-the-password"),
        "unknown job": ("nobody", None),
        "ended job": ("done", None),
        "cancelled job": ("gone", None),
        "another job's password": ("ja", credential(KEY.encode(), "jb").password),
    }[case]
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await _job_conn(server, job, password)
    assert world.callout.refused >= 1


async def test_no_credentials_and_a_service_users_name_are_refused(
        server: Server, world: World) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, connect_timeout=3, allow_reconnect=False)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, user="scheduler", password="guess", connect_timeout=3,
                           allow_reconnect=False)
    # A credential minted under another key.
    forged = credential(b"another cluster's key", "ja")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, user=forged.user, password=forged.password,
                           connect_timeout=3, allow_reconnect=False)
    assert "nats connection refused" not in server.log.read_text()  # the server's log: no
    assert forged.password not in server.log.read_text()  # password written out


async def test_a_queued_job_may_connect(server: Server, world: World) -> None:
    nc = await _job_conn(server, "jq")
    assert nc.is_connected
    await nc.close()


async def test_a_job_that_ends_is_cut_off_within_the_credentials_lifetime(
        server: Server, world: World) -> None:
    nc = await _job_conn(server, "jb")
    js = nc.jetstream()
    assert (await js.publish("safe.telemetry.job.jb", b"{}", timeout=5)).seq > 0
    await world.set_status("jb", "failed")
    ended = time.monotonic()
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await _job_conn(server, "jb")  # refused on the next connect at once
    while not nc.is_closed and time.monotonic() - ended < TTL_S + 3:
        await asyncio.sleep(0.05)
    assert nc.is_closed, "the ended job's connection is still open"
    assert time.monotonic() - ended <= TTL_S + 1.5
    assert "Authentication Expired" in server.log.read_text() or nc.last_error is not None


async def test_the_sdk_logs_in_again_while_its_job_lives(server: Server, world: World) -> None:
    """The credential expires every TTL_S; a live job's worker reconnects and
    its samples keep landing."""
    cred = credential(KEY.encode(), "ja")
    run = Run(job="ja", rank=0, world_size=1, attempt=1, node="n1",
              checkpoint_dir=Path("/nonexistent"), checkpoint_interval=10,
              nats_url=server.url, nats_user=cred.user, nats_password=cred.password)
    assert run._publisher is not None
    run._publisher.RETRY_S = 0.2
    try:
        run.report(1, loss=1.0)
        await asyncio.sleep(TTL_S + 1)  # the first login has expired
        for i in range(2, 30):
            run.report(i, loss=1.0)
            await asyncio.sleep(0.1)
    finally:
        await asyncio.to_thread(run.close, 15)  # the callout answers on this loop
    last = await world.admin.js.get_last_msg("TELEMETRY", "safe.telemetry.job.ja")
    assert json.loads(last.data)["data"]["iteration"] == 29, run.stats


async def test_without_the_callout_a_job_cannot_connect_but_services_can(
        server: Server, world: World) -> None:
    await world.callout.stop()
    with pytest.raises((nats.errors.Error, asyncio.TimeoutError, OSError)):
        await _job_conn(server, "ja")
    bus = await _as(server, "lens-collector")  # the platform's users need no callout
    await bus.close()
