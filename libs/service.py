"""The shell every service shares: logging, bus connection, topology,
a health request, and a clean stop on SIGTERM/SIGINT, bounded in time.

A service is an object with ``name``, ``async start(bus)``, ``async stop()``
and ``health() -> dict``; ``serve`` does the rest, so each service
folder only holds its own wiring around its pure core.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from libs.bus import HEALTH_SUBJECT, Bus
from libs.logs import configure, get_logger
from libs.settings import Settings


class Service(Protocol):
    name: str

    async def start(self, bus: Bus) -> None: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, Any]: ...


# Each teardown step is bounded, and one that overruns is named in the log
# rather than waited for: a pod is killed after its grace period anyway. The
# service's own stop gets the most (the scheduler lets a cycle finish, 15 s).
STOP_STEP_S = 8.0
SERVICE_STOP_S = 20.0
# Work in threads cannot be cancelled (a GEMM in C++, a collective waiting on
# a peer that left); Python would wait for it at exit for as long as it takes.
EXIT_THREADS_S = 5.0
_WORKER_PREFIX = "service-worker"


def health_subject(service: str, node: str | None = None) -> str:
    return HEALTH_SUBJECT.format(service=service) + (f".{node}" if node else "")


def instance_token() -> str:
    """This process's host name as a subject token (the pod name in
    Kubernetes): where a replica answers for itself alone."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def serve(service: Service, settings: Settings, *, node: str | None = None) -> int:
    """A service process's whole life: run until SIGTERM, stop in bounded
    steps, exit. Threads still working ``EXIT_THREADS_S`` after the stop are
    named in the log and left behind rather than waited for."""
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


async def run_service(service: Service, settings: Settings, *, node: str | None = None) -> int:
    log = configure(service.name, settings.log_level, node=node)
    # `kill -USR1 PID` prints every thread's stack to stderr: what a process
    # that will not stop is waiting on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    try:
        bus = await Bus.connect(
            settings.nats_url, service.name, token=settings.nats_token, **settings.nats_auth)
    except ConnectionError as exc:
        log.error("cannot start", error=str(exc))
        return 2
    started = time.monotonic()
    await bus.ensure_topology(settings.nats_replicas)

    async def _health(_: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "service": service.name,
            "node": node,
            "uptime_s": round(time.monotonic() - started, 3),
            "delivered": bus.stats.delivered,
            "handled": bus.stats.handled,
            "dead_lettered": bus.stats.dead_lettered,
            **service.health(),
        }

    await bus.serve(health_subject(service.name, node), _health)
    if node is None:
        # Replicas share the service's subject (any one answers); a pod's own
        # probe must reach that pod, so each also answers on its host name.
        await bus.serve(health_subject(service.name, instance_token()), _health)
    try:
        await service.start(bus)
    except Exception as exc:
        log.exception("start failed", error=str(exc))
        await bus.close()
        return 1
    log.info("started")
    await stop.wait()
    log.info("stopping")
    steps = (("stop consuming", bus.stop_consuming, STOP_STEP_S),  # no handler runs now
             ("stop service", service.stop, SERVICE_STOP_S),
             ("close bus", bus.close, STOP_STEP_S))
    for step, action, limit_s in steps:
        try:
            await asyncio.wait_for(action(), limit_s)
        except TimeoutError:
            log.error("stop step overran; going on", step=step, limit_s=limit_s)
    log.info("stopped")
    return 0
