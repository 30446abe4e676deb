"""Bootstrap service: reads the hosts file, registers each node, asks its
bench agent to prove it, and turns provisioning results, bench verdicts and
faults into node states through the onboarding state machine. It owns the
``nodes`` KV bucket (revision-checked writes) and the ``node.registered`` /
``node.state`` / ``node.removed`` events.

Re-applying a hosts file emits only the differences (see plan.diff_nodes). A
node that left the file is set ``draining`` (the scheduler moves its jobs
away), and only once the ``jobs`` bucket shows nothing running on it is it
removed: no job loses its node under it. On a cluster the platform built,
``primus-safe bootstrap apply`` hands the edited file over (request-reply,
see protocol.py), waits for the drain, runs Kubespray's remove-node.yml, and
only then asks for the removal: ``node.removed`` means gone from Kubernetes.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import Metric

from libs.bus import Bus
from libs.events import (
    BenchRequest,
    BenchRequestData,
    BenchResult,
    Event,
    FaultClosed,
    FaultOpened,
    NodeCordonRequested,
    NodeDrainRequested,
    NodeProvisioned,
    NodeRegistered,
    NodeRemoved,
    NodeRemovedData,
    NodeStateChanged,
    NodeStateData,
    NodeUncordonRequested,
    new_event_id,
)
from libs.inventory import HostsFile, HostSpec
from libs.kv import Records
from libs.logs import get_logger
from libs.metrics import ServiceMetrics, gauge_family, settled
from libs.records import INVENTORY, JOBS, NODES, InventoryRecord, NodeRecord
from libs.settings import Settings
from libs.specs import load_model
from libs.tasks import cancel_and_wait
from libs.wiring import wire
from services.bootstrap import rebench
from services.bootstrap.onboarding import (
    State,
    Trigger,
    awaits_verdict,
    step,
    verdict_overdue,
)
from services.bootstrap.plan import NodeChange, busy_jobs, diff_nodes
from services.bootstrap.protocol import (
    REMOVE_BY_KUBESPRAY,
    ApplyReply,
    ApplyRequest,
    NodeChangeOut,
    RemoveReply,
    RemoveRequest,
)
from services.bootstrap.rebench import RebenchPolicy
from services.bootstrap.routes import ROUTES

SOURCE = "bootstrap"
NodeCommand = NodeCordonRequested | NodeUncordonRequested | NodeDrainRequested
NODE_COMMANDS: dict[type[Event], str] = {
    NodeCordonRequested: "cordon", NodeUncordonRequested: "uncordon", NodeDrainRequested: "drain"}


def registration_id(host: HostSpec) -> str:
    """Same host description → same id, so re-applying a file is a no-op."""
    # ssh_key arrived later: leaving it out when unset keeps older ids stable.
    exclude = {"ssh_key"} if host.ssh_key is None else None
    digest = hashlib.sha256(host.model_dump_json(exclude=exclude).encode()).hexdigest()[:16]
    return f"reg-{host.name}-{digest}"


# Key in the ``inventory`` bucket of the hosts file ``bootstrap apply`` handed over.
HANDED_OVER_KEY = "hosts"


class Bootstrap:
    name = "bootstrap"
    routes = ROUTES

    def __init__(self, settings: Settings, hosts: HostsFile | None = None, *,
                 drain_poll_s: float = 1.0) -> None:
        self.settings = settings
        self.hosts = hosts
        if hosts is None and settings.hosts_file is not None:
            # Validated before anything is published: bad input never half-applies.
            self.hosts = load_model(settings.hosts_file, HostsFile)
        self.bus: Bus | None = None
        self.kv: Records[NodeRecord] | None = None
        self.inventory: Records[InventoryRecord] | None = None
        self.nodes: dict[str, NodeRecord] = {}
        self._boot = self.hosts  # the file this process was started with
        self.drain_poll_s = drain_poll_s
        self._drains: dict[str, asyncio.Task[None]] = {}
        # Requests, bus events and drains all change self.nodes and the
        # bucket: one at a time, so a revision check never fails on ourselves.
        self._lock = asyncio.Lock()
        self.rebench = RebenchPolicy(settings.rebench_first_s, settings.rebench_max_interval_s,
                                     settings.rebench_attempts)
        self._rebench_task: asyncio.Task[None] | None = None
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.kv = await bus.records(NODES)
        self.nodes = await self.kv.load()
        self.inventory = await bus.records(INVENTORY)
        self.hosts = await self._current_hosts(self.hosts)
        if self.hosts is not None:
            await self.apply(self.hosts)
        await wire(bus, ROUTES, self)
        self._rebench_task = asyncio.create_task(self._rebench_loop())

    async def apply(self, hosts: HostsFile, *, remove_with: str | None = None) -> list[NodeChange]:
        """Register what is new or changed, drain what left; nothing else.
        With ``remove_with="kubespray"`` a drained node waits for
        ``remove()`` (after remove-node.yml) instead of going at once."""
        assert self.bus is not None
        recorded = {name: r.spec for name, r in self.nodes.items()}
        specs = {h.name: h for h in hosts.nodes}
        changes = diff_nodes(recorded, hosts)
        for change in changes:
            if change.action == "remove":
                await self._start_drain(change.node, remove_with)
            else:
                await self._register(specs[change.node], provision=hosts.provisioned)
        for host in hosts.nodes:  # unchanged but draining (re-added): onboard again
            if self.nodes[host.name].state == "draining":
                await self._register(host, provision=hosts.provisioned, again=new_event_id())
        return changes

    async def on_apply(self, request: ApplyRequest) -> ApplyReply:
        """``bootstrap apply`` hands over an edited file; it was validated in
        full before this is called (a bad one is refused, nothing moves)."""
        hosts = request.hosts
        async with self._lock:
            changes = await self.apply(hosts, remove_with=request.remove_with)
            await self._keep_handed_over(hosts)
        self.hosts = hosts
        return ApplyReply(changes=[NodeChangeOut(node=c.node, action=c.action,
                                                 fields=list(c.fields)) for c in changes])

    async def on_remove(self, request: RemoveRequest) -> RemoveReply:
        """Kubespray removed these nodes: publish node.removed for each one
        that is drained; refuse (and say why) any that is not."""
        reason = request.reason or "removed by Kubespray remove-node.yml"
        removed, refused = [], {}
        async with self._lock:
            for node in request.nodes:
                record = self.nodes.get(node)
                if record is None:
                    removed.append(node)  # already gone: a retried request is fine
                elif record.state != "draining" or not record.drained:
                    refused[node] = f"state {record.state}, not drained: jobs may still run"
                else:
                    await self._remove(node, reason)
                    removed.append(node)
        return RemoveReply(ok=not refused, removed=removed, refused=refused)

    async def _register(self, host: HostSpec, *, provision: bool,
                        again: str | None = None) -> None:
        """``again`` makes fresh event ids when a node returns with the same
        description (JetStream would drop the old ids as duplicates)."""
        assert self.bus is not None
        reg = registration_id(host) + (f"-{again}" if again else "")
        if (drain := self._drains.pop(host.name, None)) is not None:
            drain.cancel()
        await self.bus.publish(NodeRegistered(id=reg, source=SOURCE, node=host.name,
                                              data=host.registered()))
        await self._save(NodeRecord(spec=host, registration=reg, state="registered",
                                    reason="in hosts file"))
        self._log.info("node registered", node=host.name)
        if provision:
            # Gated: preflight only after Kubespray reports the node provisioned.
            await self._set_state(host.name, "provision_started", "waiting for bootstrap apply")
        else:
            await self._request_bench(host.name)

    async def _request_bench(self, node: str, cause: str | None = None) -> None:
        assert self.bus is not None
        record = self.nodes[node]
        await self._set_state(node, "bench_requested", "onboarding preflight", cause=cause)
        await self.bus.publish(BenchRequest(
            id=f"{cause or record.registration}-bench", source=SOURCE, node=node,
            data=BenchRequestData(level=self.settings.onboarding_bench_level,
                                  reason="onboarding", expected_devices=record.spec.gpu_count),
        ))

    # ------------------------------------------------------------------ coming back

    async def _rebench_loop(self) -> None:
        """Quarantined nodes are benched again on their schedule (``rebench``)."""
        period = max(0.2, min(5.0, self.rebench.first_s / 4))
        while True:
            await asyncio.sleep(period)
            try:
                async with self._lock:
                    await self._rebench_due(time.time())
                    await self._verdicts_overdue(time.time())
            except Exception:  # this loop brings nodes back: it must live
                self._log.exception("re-bench check failed")

    async def _rebench_due(self, now: float) -> None:
        for name, record in list(self.nodes.items()):
            moved = rebench.due(record, now, self.rebench)
            if moved is None:
                continue
            await self._save(moved)
            attempt = moved.rebench_attempts
            self._log.info("re-benching a quarantined node", node=name, attempt=attempt,
                           of=self.rebench.attempts)
            expires = (datetime.fromtimestamp(moved.next_rebench_at, UTC)
                       if moved.next_rebench_at is not None else None)
            await self._repair(
                name, cause=f"{name}-rebench-{record.registration}-{int(now)}",
                reason=f"re-bench {attempt} of {self.rebench.attempts} after quarantine",
                expires_at=expires)

    async def _repair(self, node: str, cause: str, reason: str,
                      expires_at: datetime | None = None) -> None:
        """A quarantined node is benched again: ``repair`` until its result."""
        assert self.bus is not None
        record = self.nodes[node]
        await self._set_state(node, "repair_started", reason, cause=cause)
        await self.bus.publish(BenchRequest(
            id=f"{cause}-bench", source=SOURCE, node=node,
            data=BenchRequestData(level=self.settings.onboarding_bench_level, reason=reason,
                                  expected_devices=record.spec.gpu_count,
                                  expires_at=expires_at)))

    async def on_node_command(self, event: NodeCommand) -> None:
        """An operator's cordon, uncordon or drain: a hold of theirs on the
        node, kept in its record and carried by every ``node.state`` after."""
        assert self.bus is not None
        action = NODE_COMMANDS[type(event)]
        async with self._lock:
            record = self.nodes.get(event.node)
            if record is None:
                self._log.warning("command for a node bootstrap does not know",
                                  node=event.node, action=action)
                return
            who = f" by {event.data.by}" if event.data.by else ""
            why = f": {event.data.reason}" if event.data.reason else ""
            said = {"cordon": "cordoned", "uncordon": "uncordoned", "drain": "drained"}[action] \
                + who + why
            cordoned = action != "uncordon"
            await self.bus.publish(NodeStateChanged(
                id=f"{event.node}-{action}-{event.id}", source=SOURCE, node=event.node,
                data=NodeStateData(state=record.state, reason=said, schedulable=not cordoned,
                                   drain=action == "drain")))
            await self._save(record.model_copy(update={
                "cordoned": cordoned, "cordoned_by": said if cordoned else ""}))
            self._log.info("node " + said.split(" ")[0], node=event.node, by=event.data.by,
                           reason=event.data.reason)

    async def on_fault_closed(self, event: FaultClosed) -> None:
        """A quarantined node whose fault an operator closed returns through
        bench, now (DESIGN §5), not at its next scheduled re-bench."""
        async with self._lock:
            record = self.nodes.get(event.node)
            if record is None or record.state not in ("quarantined", "repair") \
                    or record.cordoned:
                return
            await self._repair(event.node, cause=f"{event.id}-closed",
                               reason=f"fault {event.data.fault_id} closed")

    async def _start_drain(self, node: str, remove_with: str | None = None) -> None:
        record = self.nodes[node]
        if record.state in ("registered", "provisioning"):
            remove_with = None  # never joined Kubernetes: nothing for remove-node.yml to do
        if record.remove_by != remove_with:
            await self._save(record.model_copy(update={"remove_by": remove_with}))
        if node not in self._drains and not self.nodes[node].drained:
            await self._set_state(node, "drain_requested", "removed from the hosts file; "
                                  "moving its jobs away")
            self._drains[node] = asyncio.create_task(self._finish_drain(node))

    async def _finish_drain(self, node: str) -> None:
        """Wait until no job runs on ``node`` (the scheduler evacuates any node
        that is not ready), then remove it. A drain can take hours: a bus
        hiccup on the way (a read timing out) is logged and tried again, or
        the node would stay draining until bootstrap restarts."""
        while True:
            try:
                await self._drain_once(node)
                return
            except Exception as exc:
                self._log.warning("drain check failed; trying again", node=node,
                                  error=repr(exc), retry_in_s=self.drain_poll_s)
                await asyncio.sleep(self.drain_poll_s)

    async def _drain_once(self, node: str) -> None:
        assert self.bus is not None
        jobs = await self.bus.records(JOBS)
        shown: list[str] = []
        while busy := busy_jobs((await jobs.load()).values(), node):
            if busy != shown:  # say it when it changes, not every poll
                self._log.info("draining", node=node, jobs=busy)
                shown = busy
            await asyncio.sleep(self.drain_poll_s)
        async with self._lock:
            self._drains.pop(node, None)
            record = self.nodes.get(node)
            if record is None or record.state != "draining":
                return  # re-added meanwhile
            if record.remove_by == REMOVE_BY_KUBESPRAY:
                # Still a Kubernetes node: bootstrap apply runs remove-node.yml next.
                await self._save(record.model_copy(update={
                    "drained": True, "reason": "drained; waiting for remove-node.yml"}))
                self._log.info("node drained", node=node)
                return
            await self._remove(node, "removed from the hosts file")

    async def _remove(self, node: str, reason: str) -> None:
        assert self.bus is not None and self.kv is not None
        record = self.nodes[node]
        await self.bus.publish(NodeRemoved(
            id=f"{node}-removed-{record.registration}", source=SOURCE, node=node,
            data=NodeRemovedData(reason=reason),
        ))
        await self.kv.delete(node)
        self.nodes.pop(node, None)
        self._log.info("node removed", node=node, reason=reason)

    def _known(self, event: BenchResult | FaultOpened | NodeProvisioned) -> bool:
        if event.node in self.nodes:
            return True
        self._log.warning("event for unknown node", node=event.node, type=event.type)
        return False

    async def on_bench_result(self, event: BenchResult) -> None:
        if event.data.trigger == "probe":
            # A periodic probe is one check, judged by failover's rules (a
            # fault quarantines the node); its recovery must not return a
            # node quarantined for another cause. Only a bench run does that.
            return
        async with self._lock:
            if self._known(event):
                reason = f"bench {event.data.level}: {event.data.reason}"
                if await self._await_verdict(event):
                    return
                await self._set_state(
                    event.node, "bench_passed" if event.data.passed else "bench_failed",
                    reason, cause=event.id)
                if event.data.passed:
                    await self._set_degraded(event.node, event.data.outcome == "degraded",
                                             reason, cause=event.id)

    async def _await_verdict(self, event: BenchResult) -> bool:
        """An agent's pass of a judged level: the node stays where it is until
        the coordinator's verdict, or ``bench_verdict_wait_s`` (then the
        agent's result stands: see ``_verdicts_overdue``)."""
        data, record = event.data, self.nodes[event.node]
        wait = self.settings.bench_verdict_wait_s
        if wait <= 0 or not awaits_verdict(record.state, level=data.level, passed=data.passed,
                                           judged_by=data.judged_by):
            return False
        await self._save(record.model_copy(update={
            "verdict_due_at": time.time() + wait,
            "reason": f"bench {data.level} passed on the node; awaiting the fleet verdict"}))
        self._log.info("bench passed on the node; awaiting the fleet verdict", node=event.node,
                       level=data.level, wait_s=wait)
        return True

    async def _verdicts_overdue(self, now: float) -> None:
        """Nodes whose fleet verdict did not come in time (no coordinator
        runs, or it is down): the agent's passing result stands."""
        for name, record in list(self.nodes.items()):
            stands = verdict_overdue(record.state, record.verdict_due_at, now)
            if stands is None:
                continue
            if stands:
                self._log.warning("no fleet verdict in time; the node's own bench stands",
                                  node=name, waited_s=self.settings.bench_verdict_wait_s)
                await self._set_state(name, "bench_passed", "bench passed on the node; no "
                                      f"fleet verdict within {self.settings.bench_verdict_wait_s:g}"
                                      " s", cause=f"{name}-verdict-{int(record.verdict_due_at)}")
            else:
                await self._save(self.nodes[name].model_copy(update={"verdict_due_at": None}))

    async def _set_degraded(self, node: str, degraded: bool, reason: str, cause: str) -> None:
        """A passing bench says whether the node is below its fleet; the
        scheduler uses a degraded node last (or not at all)."""
        assert self.bus is not None
        record = self.nodes[node]
        if record.degraded == degraded:
            return
        await self.bus.publish(NodeStateChanged(
            id=f"{node}-degraded-{cause}-{int(degraded)}", source=SOURCE, node=node,
            data=NodeStateData(state=record.state, reason=reason,
                               schedulable=not record.cordoned, degraded=degraded)))
        await self._save(record.model_copy(update={"degraded": degraded, "reason": reason}))
        self._log.info("node degraded" if degraded else "node no longer degraded", node=node,
                       reason=reason)

    async def on_fault_opened(self, event: FaultOpened) -> None:
        if event.data.scope != "node" or not event.data.quarantine:
            return  # a job's fault, or one that is only recorded
        async with self._lock:
            if self._known(event):
                await self._set_state(event.node, "fault_opened",
                                      f"fault {event.data.kind}: {event.data.reason}",
                                      cause=event.id)

    async def on_node_provisioned(self, event: NodeProvisioned) -> None:
        async with self._lock:
            if self._known(event):
                await self._provisioned(event)

    async def _provisioned(self, event: NodeProvisioned) -> None:
        if not event.data.ok:
            await self._set_state(event.node, "provision_failed",
                                  f"provisioning failed: {event.data.reason}", cause=event.id)
        elif self.nodes[event.node].state in ("registered", "provisioning", "quarantined",
                                              "repair"):
            # A successful re-run also repairs a node that failed provisioning.
            await self._set_state(event.node, "provision_started", "provisioning",
                                  cause=event.id)
            await self._set_state(event.node, "provision_succeeded", "provisioned", cause=event.id)
            await self._request_bench(event.node, cause=event.id)

    async def _set_state(self, node: str, trigger: Trigger, reason: str,
                         cause: str | None = None) -> None:
        assert self.bus is not None
        record = self.nodes[node]
        moved = step(record.state, trigger, reason)
        if moved is None:
            return
        new: State = moved.state
        await self.bus.publish(NodeStateChanged(
            id=f"{node}-state-{cause or record.registration}-{new}",
            source=SOURCE, node=node, data=NodeStateData(state=new, reason=moved.reason,
                                                         schedulable=not record.cordoned,
                                                         degraded=record.degraded),
        ))
        changed = record.model_copy(update={"state": new, "reason": moved.reason,
                                            "verdict_due_at": None})
        if new == "quarantined" and record.state != "repair":
            # Newly out of service (a failed re-bench keeps its back-off).
            changed = rebench.on_quarantine(changed, time.time(), self.rebench)
        elif new == "ready":
            changed = rebench.on_ready(changed)
        await self._save(changed)
        self._log.info("node state", node=node, state=new, reason=moved.reason)

    async def _current_hosts(self, boot: HostsFile | None) -> HostsFile | None:
        """The file to apply at start: the one last handed over by ``bootstrap
        apply`` while this same boot file was in force, else the boot file.
        Without this a restart would re-apply the boot file and undo every
        edit since (re-register removed nodes); a changed boot file (a new
        chart release) is a newer word and wins."""
        assert self.inventory is not None
        try:
            kept = await self.inventory.get(HANDED_OVER_KEY)
        except ValueError as exc:
            self._log.warning("the hosts file last handed over is unreadable; applying the "
                              "boot file", error=str(exc))
            return boot
        if kept is None or kept.boot != _identity(boot):
            return boot
        hosts = kept.hosts
        self._log.info("applying the hosts file last handed over", nodes=len(hosts.nodes))
        return hosts

    async def _keep_handed_over(self, hosts: HostsFile) -> None:
        """Durable before the reply: the hand-over survives a restart."""
        assert self.inventory is not None
        await self.inventory.put(HANDED_OVER_KEY,
                                 InventoryRecord(hosts=hosts, boot=_identity(self._boot)),
                                 on_conflict=_ours)

    async def _save(self, record: NodeRecord) -> None:
        """Bootstrap holds the truth about its nodes: a record someone else
        wrote meanwhile (an old replica still draining) is overwritten, logged."""
        assert self.kv is not None
        await self.kv.put(record.name, record, on_conflict=_ours)
        self.nodes[record.name] = record

    async def stop(self) -> None:
        await cancel_and_wait([*self._drains.values(), self._rebench_task])

    def metrics(self, metrics: ServiceMetrics) -> Callable[[], None]:
        """Nodes per onboarding state (and cordoned, degraded), read at scrape time."""

        def families() -> Iterator[Metric]:
            records = settled(lambda: list(self.nodes.values()))
            yield gauge_family("bootstrap_nodes", "nodes by onboarding state", ("state",),
                               Counter((r.state,) for r in records).items())
            yield gauge_family("bootstrap_nodes_cordoned", "nodes an operator holds", (),
                               [((), sum(r.cordoned for r in records))])
            yield gauge_family("bootstrap_nodes_degraded", "nodes benched below their fleet",
                               (), [((), sum(r.degraded for r in records))])

        return metrics.add_source(families)

    def health(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for record in self.nodes.values():
            states[record.state] = states.get(record.state, 0) + 1
        return {"nodes": len(self.nodes), "states": states}


def _identity(hosts: HostsFile | None) -> str | None:
    """A hosts file's fingerprint: which boot file a hand-over was made under."""
    if hosts is None:
        return None
    return hashlib.sha256(hosts.model_dump_json().encode()).hexdigest()


def _ours(_: NodeRecord | InventoryRecord | None) -> None:
    """On a write conflict, bootstrap's own record stands."""
