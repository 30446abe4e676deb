"""The shell every service shares: logging, bus connection, topology,
a health request, and a clean stop on SIGTERM/SIGINT, bounded in time.

A service is an object with ``name``, ``routes`` (its route table,
``libs.routes``), ``async start(bus)``, ``async stop()`` and ``health() ->
dict``; ``serve`` does the rest, so each service folder only holds its own
wiring around its pure core.

A connection the server closes for good (nats-py reconnects after network
trouble, but gives up after a protocol error) does not leave a deaf process
behind: the shell stops the service, connects again with backoff and starts
a fresh one. Health says ``connection`` and how many times that happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from libs import shutdown
from libs.bus import Bus, on_connection_lost, tls_context
from libs.logs import configure, get_logger
from libs.metrics import ServiceMetrics
from libs.routes import Empty, HealthReply, Routes, health_endpoint
from libs.settings import Settings
from libs.tasks import cancel_and_wait


class Service(Protocol):
    name: str
    routes: Routes

    async def start(self, bus: Bus) -> None: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, Any]: ...

    # Optional: ``metrics(ServiceMetrics)`` is called after ``start`` to add
    # the service's own figures (instruments, and a source read at scrape time).


# How often each durable's pending count is asked of the server for /metrics.
PENDING_POLL_S = 5.0

# Each teardown step is bounded, and one that overruns is named in the log
# rather than waited for: a pod is killed after its grace period anyway. The
# service's own stop gets the most (the scheduler lets a cycle finish, 15 s).
STOP_STEP_S = 8.0
SERVICE_STOP_S = 20.0
# Work in threads cannot be cancelled (a GEMM in C++, a collective waiting on
# a peer that left); Python would wait for it at exit for as long as it takes.
EXIT_THREADS_S = 5.0
_WORKER_PREFIX = "service-worker"
# Waits between tries to connect again after the connection was closed.
RECONNECT_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)

ServiceFactory = Callable[[], Service]


def reconnect_delay(attempt: int) -> float:
    """Seconds to wait before the ``attempt``-th try (1-based) to connect again."""
    return RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S)) - 1]


def health_subject(service: str, node: str | None = None) -> str:
    return health_endpoint(service, node).subject


def instance_token(settings: Settings | None = None) -> str:
    """Where a replica answers for itself alone, as a subject token: its
    ``PRIMUS_INSTANCE`` (replicas on one machine), else the host name (the
    pod name in Kubernetes)."""
    name = (settings.instance if settings is not None else None) or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "host"


def serve(service: Service | ServiceFactory, settings: Settings, *,
          node: str | None = None) -> int:
    """A service process's whole life: run until SIGTERM, stop in bounded
    steps, exit. Threads still working ``EXIT_THREADS_S`` after the stop are
    named in the log and left behind rather than waited for. Given a factory,
    a lost connection is survived with a fresh service instance."""
    workers = ThreadPoolExecutor(thread_name_prefix=_WORKER_PREFIX)
    with asyncio.Runner() as runner:
        runner.get_loop().set_default_executor(workers)
        code = runner.run(run_service(service, settings, node=node))
        workers.shutdown(wait=False, cancel_futures=True)  # idle workers leave now
        busy = _busy_workers(time.monotonic() + EXIT_THREADS_S)
        if busy:
            get_logger().error("threads still working at exit; leaving without them",
                               threads=busy, limit_s=EXIT_THREADS_S)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # skips the interpreter's join of every worker thread
    return code


def _busy_workers(deadline: float) -> list[str]:
    while True:
        busy = [t.name for t in threading.enumerate()
                if t.name.startswith(_WORKER_PREFIX) and t.is_alive()]
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.05)


class _Life:
    """What one process's health reports across reconnections."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.reconnects = 0
        self.last_loss = ""


async def run_service(service: Service | ServiceFactory, settings: Settings, *,
                      node: str | None = None) -> int:
    """Run until SIGTERM. ``service`` may be an instance (one connection:
    a lost connection ends the process with exit 3, for its supervisor to
    restart) or a factory (a lost connection gets a fresh instance on a new
    connection, in this process)."""
    make: ServiceFactory | None = None if hasattr(service, "start") else service  # type: ignore[assignment]
    current: Service = make() if make is not None else service  # type: ignore[assignment]
    ship_to = (settings.nats_url, settings.nats_token) if settings.log_ship else None
    # As the service's own NATS user (the chart and compose have no other login).
    ship_auth = {"user": settings.nats_user, "password": settings.nats_password,
                 "tls": tls_context(settings.nats_tls_ca, settings.nats_tls_cert,
                                    settings.nats_tls_key)} if ship_to else None
    log = configure(current.name, settings.log_level, ship_to=ship_to, ship_auth=ship_auth,
                    node=node)
    # `kill -USR1 PID` prints every thread's stack to stderr: what a process
    # that will not stop is waiting on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = asyncio.Event()
    lost = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if shutdown.asked():  # told to stop while it was still importing
        stop.set()
    life = _Life()
    metrics = _serve_metrics(current.name, settings, node, log)

    def _lost(reason: str) -> None:
        life.last_loss = reason
        loop.call_soon_threadsafe(lost.set)

    forget = on_connection_lost(_lost)
    try:
        first = True
        while True:
            bus = await _connect(current.name, settings, log, stop, first=first)
            if bus is None:
                return 2 if first else 0
            lost.clear()
            bus.metrics = metrics
            code = await _run_once(current, bus, settings, node, life, log)
            if code is not None:
                return code
            first = False
            watch = _watch_metrics(current, bus, metrics)
            ended = await _wait_first(stop, lost)
            await cancel_and_wait([watch])
            if ended is stop:
                await _teardown(current, bus, log)
                log.info("stopped")
                return 0
            log.error("connection lost; stopping the service to start it afresh",
                      reason=life.last_loss)
            await _teardown(current, bus, log)
            if make is None:
                log.error("no way to build the service afresh here; exiting for the "
                          "supervisor to restart it")
                return 3
            life.reconnects += 1
            current = make()
    finally:
        forget()
        if metrics is not None:
            metrics.close()


def _serve_metrics(name: str, settings: Settings, node: str | None,
                   log: Any) -> ServiceMetrics | None:
    """The process's /metrics, served for its whole life (across reconnections).
    A port that is taken is logged, not fatal: the service matters more."""
    if not settings.metrics:
        return None
    metrics = ServiceMetrics(name, node)
    try:
        port = metrics.serve(settings.metrics_host, settings.metrics_port)
    except OSError as exc:
        log.warning("metrics not served", host=settings.metrics_host, port=settings.metrics_port,
                  error=str(exc), fix="set PRIMUS_METRICS_PORT to a free port (0: any)")
        return metrics
    log.info("metrics served", url=f"http://{settings.metrics_host}:{port}/metrics")
    return metrics


def _watch_metrics(service: Service, bus: Bus, metrics: ServiceMetrics | None
                   ) -> asyncio.Task[None]:
    """The service's own figures added once it started, and its durables'
    pending counts asked every ``PENDING_POLL_S`` while it runs."""

    async def watch() -> None:
        if metrics is None:
            return
        add = getattr(service, "metrics", None)
        remove = None
        try:
            if add is not None:
                try:
                    remove = add(metrics)
                except Exception as exc:  # the service runs on without its own figures
                    get_logger().exception("service metrics not added", error=repr(exc))
            while True:
                await bus.measure_pending()
                await asyncio.sleep(PENDING_POLL_S)
        finally:
            if callable(remove):
                remove()

    return asyncio.create_task(watch(), name="metrics")


async def _connect(name: str, settings: Settings, log: Any, stop: asyncio.Event, *,
                   first: bool) -> Bus | None:
    """The first connection must succeed (a wrong URL fails loudly); later
    ones are tried with backoff until they do or the process is told to stop."""
    attempt = 0
    while True:
        try:
            return await Bus.connect(
                settings.nats_url, name, token=settings.nats_token, **settings.nats_auth)
        except ConnectionError as exc:
            if first:
                log.error("cannot start", error=str(exc))
                return None
            attempt += 1
            delay = reconnect_delay(attempt)
            log.warning("cannot connect again yet", error=str(exc), attempt=attempt,
                        retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return None


async def _run_once(service: Service, bus: Bus, settings: Settings, node: str | None,
                    life: _Life, log: Any) -> int | None:
    """Topology, health and the service's start on ``bus``; an exit code if it failed."""
    await bus.ensure_topology(settings.nats_replicas)
    bus.clock_skew_s = settings.clock_skew_s
    bus.routes = getattr(service, "routes", None)  # the bus refuses what it does not name

    async def _health(_: Empty) -> HealthReply:
        return HealthReply(
            ok=bus.link.state == "connected",
            service=service.name,
            node=node,
            uptime_s=round(time.monotonic() - life.started, 3),
            connection=bus.link.state,
            reconnects=life.reconnects,
            metrics_port=bus.metrics.port if bus.metrics is not None else None,
            disconnects=bus.link.disconnects,
            delivered=bus.stats.delivered,
            handled=bus.stats.handled,
            dead_lettered=bus.stats.dead_lettered,
            unknown_fields=dict(bus.stats.unknown_fields),
            skewed_stamps=dict(bus.stats.skewed),
            **service.health(),
        )

    await bus.serve(health_endpoint(service.name, node), _health)
    if node is None:
        # Replicas share the service's subject (any one answers); a pod's own
        # probe must reach that pod, so each also answers on its host name.
        await bus.serve(health_endpoint(service.name, instance_token(settings)), _health)
    try:
        await service.start(bus)
    except Exception as exc:
        log.exception("start failed", error=str(exc))
        await bus.close()
        return 1
    log.info("started", reconnects=life.reconnects)
    return None


async def _wait_first(*events: asyncio.Event) -> asyncio.Event:
    waits = {asyncio.ensure_future(e.wait()): e for e in events}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return waits[next(iter(done))]


async def _teardown(service: Service, bus: Bus, log: Any) -> None:
    log.info("stopping")
    steps = (("stop consuming", bus.stop_consuming, STOP_STEP_S),  # no handler runs now
             ("stop service", service.stop, SERVICE_STOP_S),
             ("close bus", bus.close, STOP_STEP_S))
    for step, action, limit_s in steps:
        try:
            await asyncio.wait_for(action(), limit_s)
        except TimeoutError:
            log.error("stop step overran; going on", step=step, limit_s=limit_s)
        except Exception as exc:  # a closed connection: the next step still runs
            log.warning("stop step failed; going on", step=step, error=repr(exc))
