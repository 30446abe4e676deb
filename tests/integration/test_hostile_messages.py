"""No message can deafen a service: every service runs as its own process
against a real nats-server, and on every subject any of them consumes the
test publishes a message of the server's payload limit less a few bytes,
garbage, an event of a version newer than the code reads, and an event of
another type than the subject's. Every service must keep serving, refuse
each of them into the dead-letter stream once per refusing service (never
over the payload limit: big bodies are cut with their size and digest), and
ack them, so nothing comes back on a restart."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from libs.bus import (
    BODY_SHA256_HEADER,
    BODY_SIZE_HEADER,
    CONTROL,
    DEADLETTER,
    ORIGIN_HEADER,
    REASON_HEADER,
    SERVICE_HEADER,
    TELEMETRY,
    Bus,
    headers_size,
)
from libs.events import (
    EVENT_TYPES,
    HeartbeatData,
    JobTelemetry,
    JobTelemetryData,
    NodeHeartbeat,
    encode_event,
    max_version,
)
from tests.helpers import start_service, stop_process, subject_matches, wait_healthy

pytestmark = pytest.mark.timeout(420)

NODE = "node-1"
SERVICES = [("bootstrap", []), ("scheduler", []), ("failover", []), ("bench-coordinator", []),
            ("lens-collector", []), ("bench-agent", ["--node", NODE])]
# Which service each durable consumer belongs to. A new durable must be added
# here, so a consumer nobody tested against hostile input cannot slip in.
DURABLE_OWNER = {
    "bootstrap": "bootstrap", "bootstrap-provisioned": "bootstrap",
    "scheduler": "scheduler", "failover": "failover", "failover-steps": "failover",
    "bench-coordinator": "bench-coordinator", f"bench-agent-{NODE}": "bench-agent",
    f"bench-agent-jobs-{NODE}": "bench-agent",
    "lens-events": "lens-collector", "lens-telemetry": "lens-collector",
}
KEY = "hostile-1"


def _nats_subject(pattern: str) -> str:
    """A concrete subject a filter matches (its wildcards filled in)."""
    return ".".join(KEY if t in ("*", ">") else t for t in pattern.split("."))


def _type_of(subject: str) -> str | None:
    """The event type whose subject this is, if any."""
    for cls in EVENT_TYPES:
        pattern = cls.subject_template.format(root="safe", node="*", job="*")
        if fnmatchcase(subject, pattern) and subject.count(".") == pattern.count("."):
            return cls.model_fields["type"].default
    return None


def _msg_id(case: str, subject: str) -> dict[str, str]:
    return {"Nats-Msg-Id": f"hostile-{case}-{subject}"}


def _hostile(subject: str, limit: int) -> dict[str, bytes]:
    kind = _type_of(subject) or "job.submitted"
    future = json.dumps({"id": f"future-{subject}", "type": kind, "time": "2026-01-01T00:00:00Z",
                         "source": "hostile", "node": KEY, "job": KEY, "version": 99,
                         "data": {"anything": True}}).encode()
    beat = NodeHeartbeat(source="hostile", node=KEY, data=HeartbeatData(seq=1, pid=1,
                                                                        interval_s=1))
    step = JobTelemetry(source="hostile", job=KEY, data=JobTelemetryData(rank=0, iteration=1))
    other = beat if beat.subject != subject else step
    # Its header (Nats-Msg-Id) counts against the limit too: a few bytes under it in all.
    big = b"\xff{" + b"A" * (limit - headers_size(_msg_id("big", subject)) - 4 - 2)
    return {"big": big, "garbage": b'{"type": "node.heartbeat", "data": [1, 2', "future": future,
            "wrong_type": encode_event(other)}


async def _consumed_subjects(bus: Bus) -> dict[str, set[str]]:
    """Subject -> the services whose consumers take it, from the server's
    own consumer list (not from the code): what each service really hears."""
    filters: list[tuple[str, str]] = []
    for stream in (CONTROL, TELEMETRY):
        for info in await bus.js.consumers_info(stream.name):
            owner = DURABLE_OWNER.get(info.name)
            assert owner is not None, f"consumer {info.name} is not in DURABLE_OWNER"
            config = info.config
            for f in ([config.filter_subject] if config.filter_subject else []) + list(
                    config.filter_subjects or []):
                filters.append((f, owner))
    subjects = {_nats_subject(f) for f, _ in filters}
    for cls in EVENT_TYPES:  # every concrete event subject a filter takes, too
        subject = cls.subject_template.format(root="safe", node=KEY, job=KEY)
        if any(subject_matches(f, subject) for f, _ in filters):
            subjects.add(subject)
    return {s: {owner for f, owner in filters if subject_matches(f, s)} for s in sorted(subjects)}


async def _dead_letters(bus: Bus) -> list[Any]:
    sub = await bus.js.pull_subscribe("safe.dlq.>", stream=DEADLETTER.name)
    out: list[Any] = []
    while True:
        try:
            out += await sub.fetch(200, timeout=1)
        except (nats.errors.TimeoutError, TimeoutError):
            break
    await sub.unsubscribe()
    return out


async def _unacked(bus: Bus) -> dict[str, tuple[int, int]]:
    """Consumers with messages not yet delivered or not yet acked."""
    out = {}
    for stream in (CONTROL, TELEMETRY):
        for info in await bus.js.consumers_info(stream.name):
            if info.num_pending or info.num_ack_pending:
                out[info.name] = (info.num_pending, info.num_ack_pending)
    return out


async def test_no_message_deafens_a_service(nats_url: str, bus: Bus, tmp_path: Path) -> None:
    procs = {verb: start_service(verb, args, nats_url, tmp_path) for verb, args in SERVICES}
    try:
        for verb, _ in SERVICES:
            await wait_healthy(bus, verb, NODE if verb == "bench-agent" else None, timeout=120)
        # Some services create their consumers a moment after they answer health.
        for _ in range(120):
            durables = {i.name for st in (CONTROL, TELEMETRY)
                        for i in await bus.js.consumers_info(st.name)}
            if durables >= set(DURABLE_OWNER):
                break
            await asyncio.sleep(0.5)
        assert durables == set(DURABLE_OWNER)
        consumed = await _consumed_subjects(bus)
        limit = bus.max_payload
        sent: list[tuple[str, str, set[str]]] = []  # (subject, case, owners)
        bodies = {subject: _hostile(subject, limit) for subject in consumed}
        for subject, owners in consumed.items():
            for case, body in bodies[subject].items():
                await bus.js.publish(subject, body, headers=_msg_id(case, subject))
                sent.append((subject, case, owners))

        expected = sum(len(owners) for _, _, owners in sent)
        letters: list[Any] = []
        for _ in range(240):
            letters = await _dead_letters(bus)
            if len(letters) >= expected and not await _unacked(bus):
                break
            await asyncio.sleep(0.5)

        # Each refusal once per refusing service, with the subject and reason.
        seen: dict[tuple[str, str, str], int] = {}
        for letter in letters:
            h = letter.headers
            service, origin = h[SERVICE_HEADER], h[ORIGIN_HEADER]
            assert letter.subject == f"safe.dlq.{service}"
            assert len(letter.data) + headers_size(h) <= limit, "a dead letter over the limit"
            assert origin in bodies, f"a message the test did not send was refused: {dict(h)}"
            cases = [c for c, body in bodies[origin].items()
                     if _same_body(letter, body)]
            assert len(cases) == 1, (service, origin, dict(h), letter.data[:200])
            case = cases[0]
            seen[(service, origin, case)] = seen.get((service, origin, case), 0) + 1
            if case == "future":
                newest = max_version(_type_of(origin) or "job.submitted")
                assert f"version 99 not supported (max {newest})" in h[REASON_HEADER]
            if case == "big":
                body = bodies[origin]["big"]
                assert int(h[BODY_SIZE_HEADER]) == len(body)
                assert h[BODY_SHA256_HEADER] == hashlib.sha256(body).hexdigest()
        want = {(o, s, c) for s, c, owners in sent for o in owners}
        assert set(seen) == want, f"missing {sorted(want - set(seen))[:5]}, " \
                                  f"extra {sorted(set(seen) - want)[:5]}"
        assert all(n == 1 for n in seen.values()), [k for k, n in seen.items() if n > 1]
        # The agent's heartbeats and telemetry keep flowing, so a live message
        # may be in flight at any one instant: what must not happen is a
        # consumer that never settles (a refused message coming back).
        still: dict[str, tuple[int, int]] = {}
        for _ in range(40):
            if not (still := await _unacked(bus)):
                break
            await asyncio.sleep(0.5)
        assert not still, f"a refused message would come back: {still}"

        # Every service still answers, connected, and counted what it refused.
        for verb, _ in SERVICES:
            reply = await wait_healthy(bus, verb, NODE if verb == "bench-agent" else None,
                                       timeout=10)
            assert reply["connection"] == "connected" and reply["reconnects"] == 0, reply
            assert reply["dead_lettered"] == sum(1 for k in seen if k[0] == verb), (verb, reply)

        # Restarted, a service is not fed the same messages again.
        scheduler = procs.pop("scheduler")
        assert stop_process(scheduler, tmp_path / "scheduler.log") == 0
        (tmp_path / "again").mkdir()
        procs["scheduler"] = start_service("scheduler", [], nats_url, tmp_path / "again")
        await wait_healthy(bus, "scheduler", timeout=60)
        await asyncio.sleep(2)
        assert (await wait_healthy(bus, "scheduler"))["dead_lettered"] == 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            await asyncio.to_thread(proc.wait, 40)


def _same_body(letter: Any, body: bytes) -> bool:
    return body.startswith(letter.data) if BODY_SIZE_HEADER in letter.headers else \
        letter.data == body
