"""How operator verbs reach the platform: a bus connection found from the
environment (PRIMUS_NATS_URL) or from the embedded stack's ``stack.json``,
plus reads of the owners' KV buckets and Lens's named queries."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

import nats.errors
from nats.js.errors import BucketNotFoundError, ServiceUnavailableError

from cli.routes import ROUTES as CLI_ROUTES
from libs.bus import BUCKET_APPEAR_S, Bus, shown_url
from libs.embedded import STACK_FILE, StackFileError, is_running, read_stack_file
from libs.events import JobSpec, JobSubmitted, JobSubmittedData, check_key
from libs.kv import Records
from libs.records import BucketSpec, R
from libs.settings import Settings
from libs.specs import load_model
from services.lens_collector.protocol import LENS_QUERY, LensQuery
from services.scheduler.protocol import ADMISSION, AdmissionReply, AdmissionRequest

T = TypeVar("T")


class CliError(Exception):
    """An error for the operator: printed without a traceback, exit 1."""


# A verb without a bus must say so quickly (the issue: 2 s, one line).
CONNECT_TIMEOUT_S = 1.5
# The embedded stack's supervisor starts a dead nats-server again within its
# backoff (the first restart at once, then doubling); a verb run meanwhile
# waits this long rather than failing on a bus that is only restarting.
OWNED_BUS_WAIT_S = 30.0
BUS_RETRY_S = 0.5  # how often a waiting verb knocks again


class BusTarget(NamedTuple):
    """Where a verb finds the bus, and how it came to look there."""
    url: str
    token: str | None
    where: str  # for error lines: the variable or the stack file
    owner_pid: int | None = None  # a running `primus-safe up` that restarts its nats-server


def bus_target(settings: Settings) -> tuple[str, str | None]:
    """The bus URL and its token (see ``find_bus``)."""
    target = find_bus(settings)
    return target.url, target.token


def find_bus(settings: Settings) -> BusTarget:
    """The bus: PRIMUS_NATS_URL when set, else the embedded stack's
    stack.json, else the default URL. A corrupt stack.json is a CliError
    naming it."""
    if "nats_url" in settings.model_fields_set:  # PRIMUS_NATS_URL or the settings file
        return BusTarget(settings.nats_url, settings.nats_token, "PRIMUS_NATS_URL")
    path = (Path(settings.state_dir) / STACK_FILE).resolve()
    try:
        info = read_stack_file(path)
    except StackFileError as exc:
        raise CliError(str(exc)) from None
    if info is None:
        return BusTarget(settings.nats_url, settings.nats_token,
                         f"{path} (missing: no `primus-safe up` here) and PRIMUS_NATS_URL (unset)")
    if is_running(info.pid, info.pid_start):
        return BusTarget(info.nats_url, info.nats_token, str(path), info.pid)
    return BusTarget(info.nats_url, info.nats_token,
                     f"{path}; its `primus-safe up` (pid {info.pid}) is no longer running")


def _refusal(url: str, token: str | None, auth: dict[str, Any]) -> str | None:
    """Why the NATS server at ``url`` will not take us (refused, silent, not
    NATS, a wrong token), or None when it would: one quick handshake in plain
    NATS protocol, because a failing first Bus.connect only says it timed
    out. Over TLS only Bus.connect can tell, so it is left to it."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 4222
    probe_s = CONNECT_TIMEOUT_S / 2
    try:
        with socket.create_connection((host, port), timeout=probe_s) as sock:
            sock.settimeout(probe_s)
            reader = sock.makefile("rb")
            line = reader.readline()
            if not line.startswith(b"INFO "):
                return f"{host}:{port} answers but is not a NATS server"
            if json.loads(line[5:]).get("tls_required") or auth.get("tls_ca") \
                    or auth.get("tls_cert"):
                return None
            hello: dict[str, Any] = {"verbose": False, "pedantic": False, "name": "cli-probe"}
            if token:
                hello["auth_token"] = token
            user, password = auth.get("user") or parts.username, auth.get("password")
            if user:
                hello |= {"user": user, "pass": password or parts.password or ""}
            sock.sendall(b"CONNECT " + json.dumps(hello).encode() + b"\r\nPING\r\n")
            answer = reader.readline().decode(errors="replace").strip()
            if answer.startswith("-ERR"):
                return f"the server says {answer[4:].strip()}"
            return None
    except TimeoutError:
        return f"no answer within {probe_s} s"
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    except ValueError:
        return f"{host}:{port} answers but is not a NATS server"


def bus_wait_s(settings: Settings, target: BusTarget) -> float:
    """How long a verb waits for a bus that does not answer: the operator's
    PRIMUS_CLI_BUS_WAIT_S when set; else ``OWNED_BUS_WAIT_S`` when a running
    `primus-safe up` owns the bus (its supervisor is restarting nats-server,
    which takes seconds), and no wait otherwise: a verb without a bus says
    so at once."""
    if settings.cli_bus_wait_s is not None:
        return settings.cli_bus_wait_s
    return OWNED_BUS_WAIT_S if target.owner_pid is not None else 0.0


async def _connect_once(target: BusTarget, settings: Settings) -> Bus | str:
    """A connection, or why there is none (one line)."""
    reason = _refusal(target.url.split(",")[0], target.token, settings.nats_auth)
    if reason is not None:
        return reason
    try:
        return await Bus.connect(target.url, "cli", token=target.token,
                                 timeout_s=CONNECT_TIMEOUT_S, routes=CLI_ROUTES,
                                 **settings.nats_auth)
    except ConnectionError as exc:
        if "TLS" in str(exc):
            return str(exc)
        return str(exc.__cause__ or "") or f"no NATS handshake within {CONNECT_TIMEOUT_S} s"


async def connect(settings: Settings, *, wait_s: float | None = None) -> Bus:
    """A bus connection for a CLI verb. A bus that does not answer is
    waited for up to ``wait_s`` (default: ``bus_wait_s``), with one line on
    stderr saying so; then one CliError line saying where the CLI looked,
    why it failed and what to do. A wrong token is never waited for."""
    target = find_bus(settings)
    wait_s = bus_wait_s(settings, target) if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        got = await _connect_once(target, settings)
        if not isinstance(got, str):
            return got
        if "the server says" in got or time.monotonic() >= deadline:
            break
        if not waited:
            by = (f": its `primus-safe up` (pid {target.owner_pid}) restarts nats-server"
                  if target.owner_pid is not None else "")
            print(f"primus-safe: the bus at {shown_url(target.url)} does not answer ({got})"
                  f"{by}; waiting up to {wait_s:g} s for it", file=sys.stderr, flush=True)
            waited = True
        await asyncio.sleep(min(BUS_RETRY_S, max(0.0, deadline - time.monotonic())))
    after = f" for {wait_s:g} s" if waited else ""
    raise CliError(f"cannot reach the bus at {shown_url(target.url)}{after} ({got}); "
                   f"looked at {target.where}; {unreachable_fix(target, got, settings.state_dir)}")


def unreachable_fix(target: BusTarget, reason: str, state_dir: Path) -> str:
    """What an operator can do about a bus the CLI cannot reach."""
    if "the server says" in reason:
        return ("set PRIMUS_NATS_TOKEN (or PRIMUS_NATS_USER and PRIMUS_NATS_PASSWORD) to what "
                "the server expects")
    if target.owner_pid is not None:
        return (f"its `primus-safe up` (pid {target.owner_pid}) runs but its nats-server is not "
                f"back: see its log in {Path(state_dir).resolve() / 'logs'}")
    if target.where == "PRIMUS_NATS_URL":
        return ("check that nats-server runs there (one that is restarting answers again within "
                "seconds: set PRIMUS_CLI_BUS_WAIT_S to wait for it) or fix PRIMUS_NATS_URL")
    return "start the stack with `primus-safe up` or set PRIMUS_NATS_URL"


def bus_failure(exc: BaseException) -> str:
    """What a NATS error means, in words an operator can act on (the
    client's own text for a 503 is "code=None err_code=None ...")."""
    if isinstance(exc, ServiceUnavailableError):
        return ("JetStream did not answer (503: it is not enabled on this server, or its "
                "cluster has no leader)")
    if isinstance(exc, nats.errors.NoRespondersError):
        return "nothing answered (no JetStream on this server?)"
    if isinstance(exc, nats.errors.TimeoutError):
        return "the request timed out"
    return str(exc) or type(exc).__name__


async def state_bucket(bus: Bus, spec: BucketSpec[R], *,
                       appear_s: float = BUCKET_APPEAR_S) -> Records[R]:
    """A state bucket for a verb. A JetStream that cannot answer is reported
    on the first try (services wait ``JETSTREAM_READY_S`` for it): the
    operator gets the error now, not a minute of retries."""
    return await bus.records(spec, appear_s=appear_s, ready_s=0)


async def read_bucket(bus: Bus, spec: BucketSpec[R], *, missing_ok: bool = False
                      ) -> dict[str, R]:
    """Every record of a state bucket, by key, read through its model. A
    record this release cannot read (a newer version) is named on stderr and
    left out rather than failing the verb."""
    try:
        records = await state_bucket(bus, spec, appear_s=0)  # "not there" at once, too
        found = await records.load()
    except BucketNotFoundError:
        if missing_ok:
            return {}
        raise CliError(f"no {spec.name!r} bucket on this bus: no platform service has run "
                       "here; start one with `primus-safe up`") from None
    except Exception as exc:
        raise CliError(f"cannot read the {spec.name!r} bucket: {bus_failure(exc)}; is the "
                       "platform up?") from None
    for key, why in records.unreadable.items():
        print(f"primus-safe: skipped {spec.name}/{key}: {why}", file=sys.stderr)
    return found


class LensUnanswered(CliError):
    """Nothing answered a Lens query: no lens-collector runs, or the bus is down."""


async def lens_query(bus: Bus, name: str, **params: Any) -> list[dict[str, Any]]:
    try:
        reply = await bus.ask(LENS_QUERY, LensQuery(query=name, params=params), timeout_s=15)
    except Exception as exc:
        raise LensUnanswered(f"lens-collector did not answer ({exc!r}); is it running?") from None
    if not reply.ok:
        raise CliError(f"lens query {name!r} failed: {reply.error}")
    return [dict(zip(reply.columns, row, strict=True)) for row in reply.rows]


def _admitted(answer: AdmissionReply, path: str) -> None:
    """Raise the scheduler's refusal, naming the job file's line and field;
    say so when the job is accepted as unschedulable."""
    if answer.verdict == "refused":
        field = answer.field or ""
        where = f"field {field} (not set in the file): " if field else ""
        number = field_line(Path(path).read_text(errors="replace"), field)
        if number is not None:
            where = f"line {number}, field {field}: "
        raise CliError(f"{path}: {where}refused: {answer.reason}")
    for warning in answer.warnings:
        print(f"primus-safe submit: warning: {warning}", file=sys.stderr)
    if answer.verdict == "unschedulable":
        print(f"primus-safe submit: accepted as unschedulable: {answer.reason}; it waits for "
              f"the cluster to grow and does not hold up the jobs behind it", file=sys.stderr)


def field_line(text: str, field: str) -> int | None:
    """The line of a dotted field (``resources.memory``, ``volumes.0.host_path``)
    in a YAML job file: each name is looked for after its parent's line;
    list indexes are skipped (the item's key follows its parent)."""
    number, names = 0, [p for p in field.split(".") if p and not p.isdigit()]
    lines = text.splitlines()
    for name in names:
        pattern = re.compile(rf"^[\s-]*{re.escape(name)}\s*:|[{{,]\s*{re.escape(name)}\s*:")
        found = next((i for i in range(number, len(lines)) if pattern.search(lines[i])), None)
        if found is None:
            return None
        number = found
    return number + 1 if names else None


def resolve_paths(spec: JobSpec, job_file: Path) -> JobSpec:
    """Relative paths in a job file mean the job file's directory, wherever
    the submitter stands (like docker-compose): the workers run in
    ``workdir``, which defaults to that directory and, when relative, is
    taken from it; a relative ``command`` then resolves against it."""
    base = job_file.resolve().parent
    workdir = base / spec.workdir if spec.workdir else base
    return spec.model_copy(update={"workdir": str(workdir.resolve())})


async def submit(path: str) -> str:
    """Validate a job file and queue it; returns the new job id."""
    written = load_model(path, JobSpec)
    spec = resolve_paths(written, Path(path))
    job = f"{check_key(spec.name, 'job name')[:40]}-{uuid.uuid4().hex[:6]}"
    bus = await connect(Settings())
    try:
        # Ask the scheduler leader first, so a job that can never run is
        # refused before it has an id; without an answer the job goes anyway
        # (the scheduler checks it again when it reads job.submitted).
        try:
            answer = await bus.ask(ADMISSION, AdmissionRequest(spec=spec), timeout_s=2.0)
        except Exception:
            answer = None
            print("primus-safe submit: no scheduler answered within 2 s; submitting anyway "
                  "(the scheduler checks the job when it reads it)", file=sys.stderr)
        if answer is not None and not answer.ok:
            print(f"primus-safe submit: the scheduler could not check the job "
                  f"({answer.error}); submitting anyway", file=sys.stderr)
        elif isinstance(answer, AdmissionReply):
            _admitted(answer, path)
            if answer.driver == "kubernetes":
                # Workers run in their image: its paths are not this machine's.
                spec = written
        await bus.publish(JobSubmitted(source="cli", job=job, data=JobSubmittedData(spec=spec)))
    finally:
        await bus.close()
    return job


# What a bus in the middle of a restart raises: the request already sent
# stands, and the connection comes back by itself.
BUS_DOWN = (nats.errors.Error, ConnectionError, TimeoutError)


async def wait_for(check: Callable[[], Awaitable[T | None]], timeout_s: float,
                   late: Callable[[], str]) -> T:
    """The first answer of ``check`` that is not None, asked every 0.2 s; a
    ``CliError`` with ``late()`` once ``timeout_s`` passed without one.

    The request being waited on is already durable on the bus, so a bus that
    fails meanwhile (nats-server restarting for an upgrade or after a crash)
    does not end the wait: the connection comes back by itself, and the
    wait goes on to its deadline. The operator is told once, on stderr."""
    deadline = time.monotonic() + timeout_s
    failing: str | None = None
    while True:
        try:
            answer = await check()
        except BUS_DOWN as exc:
            if failing is None:
                print(f"primus-safe: the bus failed ({bus_failure(exc)}); the request is on "
                      "it already, still waiting", file=sys.stderr)
            failing, answer = bus_failure(exc), None
        else:
            failing = None
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            raise CliError(late() + (f" (the bus is failing: {failing})" if failing else ""))
        await asyncio.sleep(0.2)
