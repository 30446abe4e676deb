"""Bootstrap service: reads the hosts file, registers each node, asks its
bench agent to prove it, and turns provisioning results, bench verdicts and
faults into node states through the onboarding state machine. It owns the
``nodes`` KV bucket (revision-checked writes) and the ``node.registered`` /
``node.state`` / ``node.removed`` events.

Re-applying a hosts file emits only the differences (see plan.diff_nodes). A
node that left the file is set ``draining`` (the scheduler moves its jobs
away), and only once the ``jobs`` bucket shows nothing running on it is it
removed: no job loses its node under it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from nats.js.errors import KeyNotFoundError, NoKeysError
from nats.js.kv import KeyValue

from libs.bus import CONTROL, Bus
from libs.events import (
    BenchRequest,
    BenchRequestData,
    BenchResult,
    Event,
    FaultOpened,
    NodeProvisioned,
    NodeRegistered,
    NodeRegisteredData,
    NodeRemoved,
    NodeRemovedData,
    NodeStateChanged,
    NodeStateData,
    new_event_id,
)
from libs.inventory import HostsFile, HostSpec
from libs.logs import get_logger
from libs.settings import Settings
from libs.specs import load_model
from services.bootstrap.onboarding import State, Trigger, step
from services.bootstrap.plan import busy_jobs, diff_nodes

SOURCE = "bootstrap"


def registration_id(host: HostSpec) -> str:
    """Same host description → same id, so re-applying a file is a no-op."""
    # ssh_key arrived later: leaving it out when unset keeps older ids stable.
    exclude = {"ssh_key"} if host.ssh_key is None else None
    digest = hashlib.sha256(host.model_dump_json(exclude=exclude).encode()).hexdigest()[:16]
    return f"reg-{host.name}-{digest}"


class Bootstrap:
    name = "bootstrap"

    def __init__(self, settings: Settings, hosts: HostsFile | None = None, *,
                 drain_poll_s: float = 1.0) -> None:
        self.settings = settings
        self.hosts = hosts
        if hosts is None and settings.hosts_file is not None:
            # Validated before anything is published: bad input never half-applies.
            self.hosts = load_model(settings.hosts_file, HostsFile)
        self.bus: Bus | None = None
        self.kv: KeyValue | None = None
        self.nodes: dict[str, dict[str, Any]] = {}
        self.drain_poll_s = drain_poll_s
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._log = get_logger()

    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.kv = await bus.kv("nodes")
        for key in await _keys(self.kv):
            entry = await self.kv.get(key)
            self.nodes[key] = json.loads(entry.value)
        if self.hosts is not None:
            await self.apply(self.hosts)
        bus.consume(
            durable="bootstrap",
            subjects=["safe.bench.*.result", "safe.fault.*.opened"],
            stream=CONTROL,
            handler=self._on_event,
        )
        # Its own durable: an existing "bootstrap" consumer keeps its filter on
        # upgrade (the bus leaves consumers as they are), so it would never see these.
        bus.consume(
            durable="bootstrap-provisioned",
            subjects=["safe.node.*.provisioned"],
            stream=CONTROL,
            handler=self._on_event,
        )

    async def apply(self, hosts: HostsFile) -> None:
        """Register what is new or changed, drain what left; nothing else."""
        assert self.bus is not None
        recorded = {name: HostSpec.model_validate(r["spec"]) for name, r in self.nodes.items()}
        specs = {h.name: h for h in hosts.nodes}
        for change in diff_nodes(recorded, hosts):
            if change.action == "remove":
                await self._start_drain(change.node)
            else:
                await self._register(specs[change.node], provision=hosts.provisioned)
        for host in hosts.nodes:  # unchanged but draining (re-added): onboard again
            if self.nodes[host.name]["state"] == "draining":
                await self._register(host, provision=hosts.provisioned, again=new_event_id())

    async def _register(self, host: HostSpec, *, provision: bool,
                        again: str | None = None) -> None:
        """``again`` makes fresh event ids when a node returns with the same
        description (JetStream would drop the old ids as duplicates)."""
        assert self.bus is not None
        reg = registration_id(host) + (f"-{again}" if again else "")
        if (drain := self._drains.pop(host.name, None)) is not None:
            drain.cancel()
        await self.bus.publish(NodeRegistered(
            id=reg, source=SOURCE, node=host.name,
            data=NodeRegisteredData(ip=host.ip, gpu_model=host.gpu_model,
                                    gpu_count=host.gpu_count, roles=list(host.roles),
                                    labels=host.labels),
        ))
        await self._save(host.name, {"spec": host.model_dump(), "registration": reg,
                                     "state": "registered", "reason": "in hosts file"})
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
            id=f"{cause or record['registration']}-bench", source=SOURCE, node=node,
            data=BenchRequestData(level="quick", reason="onboarding",
                                  expected_devices=record["spec"]["gpu_count"]),
        ))

    async def _start_drain(self, node: str) -> None:
        if node not in self._drains:
            await self._set_state(node, "drain_requested", "removed from the hosts file; "
                                  "moving its jobs away")
            self._drains[node] = asyncio.create_task(self._finish_drain(node))

    async def _finish_drain(self, node: str) -> None:
        """Wait until no job runs on ``node`` (the scheduler evacuates any node
        that is not ready), then remove it."""
        assert self.bus is not None
        jobs_kv = await self.bus.kv("jobs")
        while busy := busy_jobs(await _records(jobs_kv), node):
            self._log.info("draining", node=node, jobs=busy)
            await asyncio.sleep(self.drain_poll_s)
        record = self.nodes.get(node)
        if record is None or record["state"] != "draining":
            return  # re-added meanwhile
        await self.bus.publish(NodeRemoved(
            id=f"{node}-removed-{record['registration']}", source=SOURCE, node=node,
            data=NodeRemovedData(reason="removed from the hosts file"),
        ))
        assert self.kv is not None
        await self.kv.delete(node)
        self.nodes.pop(node, None)
        self._drains.pop(node, None)
        self._log.info("node removed", node=node)

    async def _on_event(self, event: Event) -> None:
        if event.node not in self.nodes:
            self._log.warning("event for unknown node", node=event.node, type=event.type)
            return
        trigger: Trigger
        if isinstance(event, BenchResult):
            trigger = "bench_passed" if event.data.passed else "bench_failed"
            reason = f"bench {event.data.level}: {event.data.reason}"
        elif isinstance(event, FaultOpened):
            if event.data.scope != "node" or not event.data.cordon:
                return  # a job's fault, or one that is only recorded
            trigger, reason = "fault_opened", f"fault {event.data.kind}: {event.data.reason}"
        elif isinstance(event, NodeProvisioned):
            await self._on_provisioned(event)
            return
        else:
            return
        await self._set_state(event.node, trigger, reason, cause=event.id)

    async def _on_provisioned(self, event: NodeProvisioned) -> None:
        assert event.node is not None
        if not event.data.ok:
            await self._set_state(event.node, "provision_failed",
                                  f"provisioning failed: {event.data.reason}", cause=event.id)
        elif self.nodes[event.node]["state"] in ("registered", "provisioning", "quarantined",
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
        moved = step(record["state"], trigger, reason)
        if moved is None:
            return
        new: State = moved.state
        await self.bus.publish(NodeStateChanged(
            id=f"{node}-state-{cause or record['registration']}-{new}",
            source=SOURCE, node=node, data=NodeStateData(state=new, reason=moved.reason),
        ))
        await self._save(node, {**record, "state": new, "reason": moved.reason})
        self._log.info("node state", node=node, state=new, reason=moved.reason)

    async def _save(self, node: str, record: dict[str, Any]) -> None:
        assert self.kv is not None
        value = json.dumps(record).encode()
        try:
            entry = await self.kv.get(node)
            await self.kv.update(node, value, last=entry.revision)
        except KeyNotFoundError:
            await self.kv.create(node, value)
        self.nodes[node] = record

    async def stop(self) -> None:
        for task in self._drains.values():
            task.cancel()

    def health(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for record in self.nodes.values():
            states[record["state"]] = states.get(record["state"], 0) + 1
        return {"nodes": len(self.nodes), "states": states}


async def _records(kv: KeyValue) -> list[dict[str, Any]]:
    out = []
    for key in await _keys(kv):
        try:
            out.append(json.loads((await kv.get(key)).value))
        except (KeyNotFoundError, ValueError):
            continue  # deleted meanwhile or not ours to judge
    return out


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return await kv.keys()
    except NoKeysError:
        return []
