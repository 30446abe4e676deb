"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import nats.errors

from libs.bus import Bus
from libs.events import (
    JobSpec,
    NodeRegistered,
    NodeRegisteredData,
    NodeStateChanged,
    NodeStateData,
    WorkerSlot,
)
from libs.records import BUCKETS, JobRecord
from libs.service import health_subject
from libs.topology import subject_matches  # noqa: F401  (tests match subjects as NATS does)

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("primus-safe", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "cli.main"]
    return subprocess.run([*cmd, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def start_service(verb: str, args: list[str], nats_url: str, tmp_path: Path,
                  **env: str) -> subprocess.Popen[bytes]:
    """``primus-safe <verb>`` as a process of its own against ``nats_url``,
    its output in ``tmp_path/<verb>.log``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    # /metrics on any free port (the health reply says which): several at once here.
    full_env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_STATE_DIR=str(tmp_path / "state"),
                    PRIMUS_CLICKHOUSE_DSN=f"chdb://{tmp_path / 'chdb'}",
                    PRIMUS_METRICS_PORT="0",
                    # Nodes onboard with the quick level here (no coordinator runs in
                    # most of these tests to give the standard level its verdict).
                    PRIMUS_ONBOARDING_BENCH_LEVEL="quick",
                    # This machine's health is not what these tests are about
                    # (tests/bench_agent/test_health_* run the catalogue here).
                    PRIMUS_BENCH_HEALTH_CATALOGUE="false", **env)
    log = (tmp_path / f"{verb}.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "cli.main", verb, *args], env=full_env,
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def stop_process(proc: subprocess.Popen[bytes], log: Path | None = None,
                 timeout: float = 30, *, signalled: bool = False) -> int:
    """SIGTERM a service process (unless the caller already has: a second one
    could land after its handler is gone) and return its exit code. One that
    does not stop in time is made to print its threads' stacks (the service
    shell registers SIGUSR1 with faulthandler), killed, and reported with its log."""
    if not signalled:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        proc.wait()
        tail = log.read_text(errors="replace")[-6000:] if log is not None and log.exists() else ""
        raise AssertionError(f"{proc.args} did not stop within {timeout} s of SIGTERM; "
                             f"its log ends:\n{tail}") from None


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10) -> int:
    """Stop a server the test started (not one of ours: no stack dump): SIGTERM,
    then SIGKILL if it has not exited within ``timeout``; its exit code."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def stack_cli_env(state_dir: Path) -> dict[str, str]:
    """The environment a CLI call against an embedded stack needs: its state
    directory (where stack.json names the bus), and no other PRIMUS_ setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_STATE_DIR"] = str(state_dir)
    return env


def bus_cli_env(nats_url: str) -> dict[str, str]:
    """The environment a CLI call against a bare nats-server needs: its URL,
    and no other PRIMUS_ setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_NATS_URL"] = nats_url
    return env


def trouble(log_dir: Path, last: int = 8) -> str:
    """The last ``last`` warnings and errors of each service log in
    ``log_dir`` (JSON lines), for a failed stack test's message: CI keeps
    the message, not the stack's directory."""
    parts = []
    for path in sorted(log_dir.glob("*.log")):
        found = [_shown(e) for e in _json_lines(path)
                 if e.get("level") in ("warning", "error", "critical")]
        if found:
            parts.append(f"{path.name}:\n" + "\n".join(found[-last:]))
    return "\n".join(parts) or "(no warnings or errors logged)"


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a log (a service's structlog lines; others skipped)."""
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def _shown(entry: dict[str, Any]) -> str:
    rest = " ".join(f"{k}={v}" for k, v in entry.items()
                    if k not in ("timestamp", "level", "event", "service"))
    return f"  {entry.get('timestamp', '')} {entry['level']} {entry.get('event', '')} {rest[:400]}"


async def wait_healthy(bus: Bus, service: str, node: str | None = None,
                       timeout: float = 90) -> dict:  # type: ignore[type-arg]
    """A service's health reply, asking until it answers (it may be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await bus.request(health_subject(service, node), timeout_s=1)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def ready_nodes(bus: Bus, nodes: dict[str, tuple[int, str]]) -> None:
    """Play bootstrap's part for scheduler tests: nodes (name -> (GPUs,
    rack)) in the ``nodes`` bucket and on the bus, all ready."""
    kv = await bus.kv("nodes")
    for i, (name, (gpus, rack)) in enumerate(sorted(nodes.items()), 1):
        spec = {"name": name, "ip": f"10.0.0.{i}", "gpu_model": "MI300X", "gpu_count": gpus,
                "labels": {"rack": rack}, "roles": ["worker"], "ssh_user": None}
        await kv.put(name, json.dumps({"spec": spec, "state": "ready", "reason": "",
                                       "registration": f"reg-{name}"}).encode())
        await bus.publish(NodeRegistered(source="test", node=name, data=NodeRegisteredData(
            ip=spec["ip"], gpu_model="MI300X", gpu_count=gpus, labels={"rack": rack})))
        await bus.publish(NodeStateChanged(source="test", node=name,
                                           data=NodeStateData(state="ready")))


async def until(fn, what: str, timeout: float = 60, every: float = 0.2) -> Any:  # type: ignore[no-untyped-def]
    """The first truthy value of ``await fn()``, asking every ``every`` s (an
    exception counts as not yet: the service may still be starting, a
    stream electing its leader); the last one is named if time runs out."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = await fn()
        except Exception as exc:
            value, last = None, exc
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f" (last error: {last!r})" if last else ""))


def fail_once(call: Callable[..., Any], when: Callable[[Any], bool], *,
              lands: bool = False) -> tuple[Callable[..., Any], list[str]]:
    """``call`` (a bound ``Records.put`` or ``Bus.publish``) that, the first
    time ``when`` holds for what it writes, raises NATS's timeout: before
    the request is sent, or (``lands``) after it was carried out, as when
    the answer is what got lost. The list names what was failed."""
    failed: list[str] = []

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        what = args[-1]  # put(key, record) or publish(event)
        if failed or not when(what):
            return await call(*args, **kwargs)
        failed.append(type(what).__name__)
        if lands:
            await call(*args, **kwargs)
        raise nats.errors.TimeoutError

    return wrapped, failed


def job_record(job: str, status: str, *nodes: str) -> bytes:
    """A ``jobs`` bucket record, as the scheduler writes it, of a one-GPU-per-rank
    job running (or not) on ``nodes``: for tests that play the scheduler."""
    spec = JobSpec(name="test", workers=max(1, len(nodes)), gpus_per_worker=1, command=["true"])
    return JobRecord(id=job, spec=spec, submitted_at=time.time(), status=status,  # type: ignore[arg-type]
                     slots=[WorkerSlot(rank=i, node=n, gpus=1) for i, n in enumerate(nodes)]
                     ).model_dump_json().encode()


async def bucket(bus: Bus, name: str) -> dict[str, dict[str, Any]]:
    """A state bucket's records, through their models, as plain data."""
    spec = next(b for b in BUCKETS if b.name == name)
    return {k: r.model_dump(mode="json") for k, r in (await (await bus.records(spec)).load()
                                                     ).items()}


async def stream_messages(bus: Bus, subject: str, idle_s: float = 1.0) -> list[Any]:
    """Every message a stream holds on ``subject``, oldest first (read until
    none comes for ``idle_s``)."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while True:
            out.append(await sub.next_msg(timeout=idle_s))
    except Exception:
        return out
    finally:
        await sub.unsubscribe()


async def lens_rows(bus: Bus, query: str, **params: object) -> list[dict[str, Any]]:
    """A named Lens query over the bus, as rows of column -> value."""
    reply = await bus.request("safe.query.lens.query", {"query": query, "params": params},
                              timeout_s=20)
    assert reply["ok"], reply
    return [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]


@contextlib.asynccontextmanager
async def running_collector(nats_url: str, clickhouse_dsn: str, database: str,
                            **options: Any) -> AsyncIterator[tuple[Any, Bus]]:
    """lens-collector in this process on its own connection: (service, bus)."""
    from libs.settings import Settings
    from services.lens_collector.app import LensCollector

    bus = await Bus.connect(nats_url, "lens-collector")
    await bus.ensure_topology()
    service = LensCollector(Settings(nats_url=nats_url, clickhouse_dsn=clickhouse_dsn,
                                     clickhouse_database=database),
                            **{"fill_s": 0.05, **options})
    await service.start(bus)
    try:
        yield service, bus
    finally:
        await bus.stop_consuming()
        await service.stop()
        await bus.close()


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (the benchmarks are scripts, not a
    package), for tests of their own logic."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
