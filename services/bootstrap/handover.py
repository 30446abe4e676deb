"""The operator side of talking to a running bootstrap service: what it
knows (the ``nodes`` bucket), handing it an edited hosts file, waiting for
the drains it runs, and asking it to remove nodes once Kubespray did.

Used by ``primus-safe bootstrap plan|apply``; every function takes a
connected bus (or says the bus is not there), so the verb decides what
offline means.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
from nats.js.errors import BucketNotFoundError

from libs.bus import Bus
from libs.inventory import HostsFile, HostSpec
from libs.nats_urls import servers
from libs.records import JOBS, NODES, NodeRecord
from libs.routes import Routes
from libs.settings import Settings
from services.bootstrap.plan import busy_jobs
from services.bootstrap.protocol import APPLY, REMOVE, ApplyRequest, RemoveRequest, drained


@dataclass(frozen=True)
class LiveNodes:
    """The nodes bootstrap knows right now, from its ``nodes`` bucket."""

    url: str
    records: dict[str, NodeRecord]

    @property
    def specs(self) -> dict[str, HostSpec]:
        """Nodes that are in the cluster. One still waiting for Kubespray
        (registered, provisioning) is not: a plan must still add it, or an
        apply that failed half-way would never provision it."""
        return {name: r.spec for name, r in self.records.items() if name not in self.pending}

    @property
    def pending(self) -> list[str]:
        return sorted(name for name, r in self.records.items()
                      if r.state in ("registered", "provisioning"))

    def provisioned_any(self) -> bool:
        """Whether some node got past provisioning: then a cluster exists."""
        return len(self.pending) < len(self.records)


async def open_bus(url: str, token: str | None, settings: Settings | None = None, *,
                   timeout_s: float = 2.0, routes: Routes | None = None) -> Bus | None:
    """A bus connection, or None when nothing answers at ``url`` (offline).
    One quiet attempt first: offline is an expected answer here, not a
    reason to retry and log until a timeout. ``settings`` brings the user,
    password and TLS files when the bus asks for them."""
    auth: dict[str, Any] = settings.nats_auth if settings is not None else {}

    async def quiet(_: Exception) -> None:
        return None

    if not auth.get("tls_ca"):  # the probe speaks plain NATS only
        try:
            probe = await asyncio.wait_for(nats.connect(
                servers(url), token=token, user=auth.get("user"), password=auth.get("password"),
                connect_timeout=timeout_s, allow_reconnect=False, max_reconnect_attempts=0,
                error_cb=quiet), timeout_s + 1)
        except (nats.errors.NoServersError, OSError, TimeoutError):
            return None
        await probe.close()
    try:  # the real one reconnects, for drains that take a while
        return await Bus.connect(url, "cli", token=token, timeout_s=timeout_s, routes=routes,
                                 **auth)
    except ConnectionError:
        return None


async def read_live(bus: Bus, url: str) -> LiveNodes | None:
    """None when the bus has no ``nodes`` bucket: bootstrap never ran there."""
    try:
        nodes = await bus.records(NODES, appear_s=0)  # no bootstrap ever ran here
    except BucketNotFoundError:
        return None
    return LiveNodes(url, await nodes.load())  # records this release cannot read are skipped


async def hand_over(bus: Bus, hosts: HostsFile, *, remove_with: str | None,
                    timeout_s: float = 30.0) -> list[dict[str, Any]] | None:
    """Give bootstrap the edited file; its changes, or None when no
    bootstrap service answers. A refusal raises ValueError with its reason."""
    request = ApplyRequest(hosts=hosts, remove_with=remove_with)  # type: ignore[arg-type]
    try:
        reply = await bus.ask(APPLY, request, timeout_s=timeout_s)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return None
    if not reply.ok:
        raise ValueError(f"bootstrap refused the hosts file: {reply.error}")
    return [change.model_dump() for change in reply.changes]


async def wait_drained(bus: Bus, nodes: list[str], *, timeout_s: float, poll_s: float = 1.0,
                       on_wait: Callable[[str, list[str]], None] = lambda n, j: None,
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Block until bootstrap reports every node in ``nodes`` drained (the
    scheduler moved its jobs away). ``on_wait`` hears (node, running jobs)
    whenever that changes. TimeoutError names what still runs."""
    records, job_records = await bus.records(NODES), await bus.records(JOBS)
    deadline = clock() + timeout_s
    shown: dict[str, list[str]] = {}
    while True:
        waiting: dict[str, list[str]] = {}
        for node in nodes:
            if not drained(await records.get(node)):
                waiting[node] = busy_jobs((await job_records.load()).values(), node)
        if not waiting:
            return
        for node, jobs in waiting.items():
            if shown.get(node) != jobs:
                on_wait(node, jobs)
                shown[node] = jobs
        if clock() >= deadline:
            still = "; ".join(f"{n}: {', '.join(j) or 'no job, bootstrap not done'}"
                              for n, j in waiting.items())
            raise TimeoutError(f"not drained after {timeout_s:.0f}s ({still})")
        await asyncio.sleep(poll_s)


async def ask_remove(bus: Bus, nodes: list[str], *, reason: str) -> list[str]:
    """Ask bootstrap to publish node.removed for ``nodes``; the removed ones.
    A refusal (a node not drained) raises ValueError naming it."""
    reply = await bus.ask(REMOVE, RemoveRequest(nodes=nodes, reason=reason), timeout_s=30)
    if not reply.ok:
        why = getattr(reply, "refused", None) or reply.error
        raise ValueError(f"bootstrap did not remove every node: {why}")
    return list(reply.removed)
