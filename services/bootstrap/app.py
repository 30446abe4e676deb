"""Bootstrap service: reads the hosts file, registers each node, asks its
bench agent to prove it, and turns bench verdicts and faults into node
states through the onboarding state machine. It owns the ``nodes`` KV bucket
(revision-checked writes) and the ``node.registered`` / ``node.state`` events.
"""

from __future__ import annotations

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
    NodeRegistered,
    NodeRegisteredData,
    NodeStateChanged,
    NodeStateData,
)
from libs.inventory import HostsFile, HostSpec
from libs.logs import get_logger
from libs.settings import Settings
from libs.specs import load_model
from services.bootstrap.onboarding import State, Trigger, step

SOURCE = "bootstrap"


def registration_id(host: HostSpec) -> str:
    """Same host description → same id, so re-applying a file is a no-op."""
    digest = hashlib.sha256(host.model_dump_json().encode()).hexdigest()[:16]
    return f"reg-{host.name}-{digest}"


class Bootstrap:
    name = "bootstrap"

    def __init__(self, settings: Settings, hosts: HostsFile | None = None) -> None:
        self.settings = settings
        self.hosts = hosts
        if hosts is None and settings.hosts_file is not None:
            # Validated before anything is published: bad input never half-applies.
            self.hosts = load_model(settings.hosts_file, HostsFile)
        self.bus: Bus | None = None
        self.kv: KeyValue | None = None
        self.nodes: dict[str, dict[str, Any]] = {}
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

    async def apply(self, hosts: HostsFile) -> None:
        assert self.bus is not None
        for host in hosts.nodes:
            reg = registration_id(host)
            record = self.nodes.get(host.name)
            if record is not None and record["registration"] == reg:
                continue  # unchanged
            await self.bus.publish(NodeRegistered(
                id=reg, source=SOURCE, node=host.name,
                data=NodeRegisteredData(ip=host.ip, gpu_model=host.gpu_model,
                                        gpu_count=host.gpu_count, roles=list(host.roles),
                                        labels=host.labels),
            ))
            await self._save(host.name, {"spec": host.model_dump(), "registration": reg,
                                         "state": "registered", "reason": "in hosts file"})
            await self._set_state(host.name, "bench_requested", "onboarding preflight")
            await self.bus.publish(BenchRequest(
                id=f"{reg}-bench", source=SOURCE, node=host.name,
                data=BenchRequestData(level="quick", reason="onboarding",
                                      expected_devices=host.gpu_count),
            ))
            self._log.info("node registered", node=host.name)

    async def _on_event(self, event: Event) -> None:
        if event.node not in self.nodes:
            self._log.warning("event for unknown node", node=event.node, type=event.type)
            return
        trigger: Trigger
        if isinstance(event, BenchResult):
            trigger = "bench_passed" if event.data.passed else "bench_failed"
            reason = f"bench {event.data.level}: {event.data.reason}"
        elif isinstance(event, FaultOpened):
            trigger, reason = "fault_opened", f"fault {event.data.kind}: {event.data.reason}"
        else:
            return
        await self._set_state(event.node, trigger, reason, cause=event.id)

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
        pass

    def health(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for record in self.nodes.values():
            states[record["state"]] = states.get(record["state"], 0) + 1
        return {"nodes": len(self.nodes), "states": states}


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return await kv.keys()
    except NoKeysError:
        return []
