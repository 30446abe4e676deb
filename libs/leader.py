"""Leader election on a JetStream KV lease, so a service can run as several
replicas with exactly one acting (the scheduler, the bench coordinator).

The ``leases`` bucket holds one key per role (``scheduler``). A candidate
takes the lease by creating the key (create-if-absent: revision 0), renews it
every ttl/3 by writing at the revision it knows, and loses it when a write is
refused (someone else holds it now) or when it could not renew in time. Every
write carries a per-message TTL, so the key of a leader that died vanishes
after ``ttl_s`` and a standby, which reads the key every tick, creates it
anew. A leader that exits cleanly deletes the key (at its own revision), so
the handover is immediate.

Fencing: a leader counts itself leader only until ``FENCE`` x ttl after it
*sent* its last successful renewal; the server keeps the key ttl after it
*received* it, so a deposed leader has stopped acting before anyone else can
take the key. The term is the revision of the write that won the lease: it
grows with every new leader, and services write it with their state so a
stale leader's write can be told apart (see the scheduler's job records).

``decide`` is the whole policy and is pure; ``LeaderElection`` is the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import nats.js.errors
from nats.js import api
from nats.js.kv import KeyValue

from libs.bus import Bus
from libs.logs import get_logger
from libs.records import LEASES, LeaseRecord
from libs.settings import Settings
from libs.tasks import cancel_and_wait

LEASES_BUCKET = LEASES.name
# A leader stops acting this far into its TTL without a renewal; the rest of
# the TTL is the margin for effects already in flight to land.
FENCE = 0.8
# How often a candidate looks at the lease, as a fraction of the TTL (capped
# at MAX_TICK_S): a leader renews between ttl/3 and ttl/3 + tick.
TICK = 1 / 6
MAX_TICK_S = 1.0
_WRONG_REVISION = (10071, 10164)  # JSStreamWrongLastSequence(Constant)Err


class NotLeader(RuntimeError):
    """Raised before an effect that only the leader may have."""


class Action(StrEnum):
    TAKE = "take"
    RENEW = "renew"
    STEP_DOWN = "step_down"
    WAIT = "wait"


@dataclass(frozen=True)
class Seen:
    """The lease as last read from the bucket."""

    holder: str
    revision: int


@dataclass(frozen=True)
class Held:
    """What a leader knows of its own lease."""

    term: int        # revision of the write that won it
    revision: int    # revision of our latest write: the next renewal is at it
    renewed_at: float  # (monotonic) when that write was sent


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def fence_after(ttl_s: float) -> float:
    return FENCE * ttl_s


def tick_s(ttl_s: float) -> float:
    return min(MAX_TICK_S, ttl_s * TICK)


def leads(held: Held | None, *, now: float, ttl_s: float) -> bool:
    """Pure: may the holder of ``held`` act at ``now``?"""
    return held is not None and now - held.renewed_at < fence_after(ttl_s)


def decide(*, me: str, held: Held | None, seen: Seen | None, seen_known: bool = True,
           now: float, ttl_s: float) -> Decision:
    """Pure: what a candidate does next, given what it holds, what the bucket
    showed (``seen_known`` is False when the read failed) and the time."""
    if held is None:
        if not seen_known:
            return Decision(Action.WAIT, "cannot read the lease")
        if seen is None:
            return Decision(Action.TAKE, "no leader: the lease is free")
        if seen.holder == me:  # we restarted (a holder name is one replica's, see holder_name)
            return Decision(Action.TAKE, "our own lease from before a restart")
        return Decision(Action.WAIT, f"{seen.holder} leads")
    if seen_known and seen is None:
        return Decision(Action.STEP_DOWN, "the lease is gone (expired or deleted)")
    if seen_known and seen is not None and (seen.holder != me or seen.revision != held.revision):
        return Decision(Action.STEP_DOWN, f"the lease moved to {seen.holder} "
                                          f"(revision {seen.revision})")
    age = now - held.renewed_at
    if age >= fence_after(ttl_s):
        return Decision(Action.STEP_DOWN, f"could not renew the lease for {age:.1f}s "
                                          f"(ttl {ttl_s:g}s)")
    if age >= ttl_s / 3:
        return Decision(Action.RENEW, "a third of the ttl has passed")
    return Decision(Action.WAIT, "leading")


def holder_name(configured: str | None, state_dir: Path) -> str:
    """This replica's name in the lease: the configured one (the chart uses
    the pod name), else the host plus its state directory. It survives a
    restart, so a replica that crashed takes its own lease back at once
    instead of waiting out the TTL; two live replicas need different names."""
    if configured:
        return configured
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"{socket.gethostname()}-{digest}"


class LeaderElection:
    """Campaigns for ``role`` until stopped; ``is_leader`` says whether this
    process may act right now (check it before every effect)."""

    def __init__(self, bus: Bus, role: str, *, ttl_s: int, holder: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 1 or ttl_s != int(ttl_s):
            # NATS keeps per-message TTLs in whole seconds (and truncates).
            raise ValueError(f"leader ttl for {role!r} must be a whole number of seconds "
                             f">= 1, not {ttl_s!r}: set PRIMUS_LEADER_TTL_S")
        self.bus, self.role, self.ttl_s = bus, role, int(ttl_s)
        self.holder = holder
        self._clock = clock
        self._kv: KeyValue | None = None
        self._held: Held | None = None
        self._seen: Seen | None = None
        self._free_at = 0  # the revision a free lease is taken at
        self._elected = asyncio.Event()
        self._deposed = asyncio.Event()
        self._deposed.set()
        self._reason = "not elected yet"
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger(component="leader", role=role, holder=self.holder)

    @classmethod
    def for_service(cls, bus: Bus, role: str, settings: Settings) -> LeaderElection:
        """The election a service replica runs: TTL and name from its settings."""
        return cls(bus, role, ttl_s=settings.leader_ttl_s,
                   holder=holder_name(settings.leader_id, settings.state_dir))

    # ------------------------------------------------------------------ state

    @property
    def is_leader(self) -> bool:
        return leads(self._held, now=self._clock(), ttl_s=self.ttl_s)

    @property
    def term(self) -> int | None:
        return self._held.term if self.is_leader and self._held else None

    def check(self) -> int:
        """The current term; raises NotLeader when this process may not act."""
        held = self._held
        if held is None or not leads(held, now=self._clock(), ttl_s=self.ttl_s):
            raise NotLeader(f"{self.holder} is not the {self.role} leader")
        return held.term

    def describe(self) -> dict[str, Any]:
        """For health: this replica's role and who leads."""
        leader = self.is_leader
        return {"role": "leader" if leader else "standby", "term": self.term,
                "holder": self.holder,
                "leader": self.holder if leader else (self._seen.holder if self._seen else None)}

    async def wait_elected(self) -> int:
        while True:
            await self._elected.wait()
            if self._held is not None:
                return self._held.term
            await asyncio.sleep(0)  # lost again meanwhile

    async def wait_deposed(self) -> str:
        await self._deposed.wait()
        return self._reason

    # ------------------------------------------------------------------ run

    async def start(self) -> None:
        self._kv = await self.bus.kv(LEASES_BUCKET)
        await self._step()  # take a free lease at once
        self._task = asyncio.create_task(self._loop(), name=f"leader:{self.role}")

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning; a leader deletes its lease so a standby takes
        over now instead of after the TTL."""
        self._stop.set()
        if self._task is not None:
            # Let a write in flight land rather than cancel it: a renewal the
            # server applied but this process never recorded leaves the
            # delete below at a stale revision, and the lease would then
            # expire instead of being handed over. The loop sees the stop at
            # its next await; a step stuck on NATS is cancelled after a tick.
            await asyncio.wait([self._task], timeout=tick_s(self.ttl_s))
            await cancel_and_wait([self._task])
        held = self._held
        if held is not None:
            self._lose("stopped", expected=True)
            if release and self._kv is not None:
                with contextlib.suppress(Exception):  # not ours any more, or NATS is gone
                    await self._kv.delete(self.role, last=held.revision)
                    self._log.info("released the lease", term=held.term)

    async def resign(self, reason: str) -> None:
        """Give the lease up now (the leader cannot do its job) and campaign again."""
        held = self._held
        if held is None:
            return
        self._lose(reason)
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self.role, last=held.revision)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), tick_s(self.ttl_s))
            if self._stop.is_set():
                return
            try:
                await self._step()
            except Exception:  # never let the campaign die: the next tick retries
                self._log.exception("lease step failed")

    async def _step(self) -> None:
        known = True
        try:
            self._seen = await self._read()
        except Exception as exc:
            known = False
            self._log.warning("cannot read the lease", error=str(exc))
        decision = decide(me=self.holder, held=self._held, seen=self._seen, seen_known=known,
                          now=self._clock(), ttl_s=self.ttl_s)
        if decision.action is Action.TAKE:
            await self._take()
        elif decision.action is Action.RENEW:
            await self._renew()
        elif decision.action is Action.STEP_DOWN:
            self._lose(decision.reason)

    # ------------------------------------------------------------------ I/O

    async def _read(self) -> Seen | None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(self.role)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError) as exc:
            # A deleted key is taken at its delete marker's revision; an
            # expired one has no entry left, so at 0.
            marker = getattr(exc, "entry", None)
            self._free_at = (marker.revision or 0) if marker is not None else 0
            return None
        if entry.value is None or entry.revision is None:
            return None
        try:
            holder = LeaseRecord.model_validate_json(entry.value).holder
        except ValueError:
            holder = "?"  # not a lease we can read: someone holds it all the same
        return Seen(holder=holder, revision=entry.revision)

    def _value(self, term: int | None) -> bytes:
        return LeaseRecord(holder=self.holder, role=self.role, term=term, ttl_s=self.ttl_s,
                           pid=os.getpid(), written_at=time.time()).model_dump_json().encode()

    async def _write(self, value: bytes, *, last: int) -> int:
        """Write the lease at revision ``last`` (0: only if absent) with the TTL.
        nats-py's KeyValue.update takes no TTL, so this is its publish with one."""
        headers = {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last),
                   api.Header.MSG_TTL: str(self.ttl_s)}
        try:
            ack = await self.bus.js.publish(f"$KV.{LEASES_BUCKET}.{self.role}", value,
                                            headers=headers)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_REVISION:
                raise nats.js.errors.KeyWrongLastSequenceError(description=exc.description) \
                    from exc
            raise
        return ack.seq

    async def _take(self) -> None:
        sent = self._clock()
        try:
            last = self._seen.revision if self._seen is not None else self._free_at
            revision = await self._write(self._value(None), last=last)
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # another candidate was faster
        except Exception as exc:
            self._log.warning("cannot take the lease", error=str(exc))
            return
        self._held = Held(term=revision, revision=revision, renewed_at=sent)
        self._seen = Seen(self.holder, revision)
        self._reason = ""
        self._deposed.clear()
        self._elected.set()
        self._log.info("elected leader", term=revision, ttl_s=self.ttl_s)
        await self._renew()  # records the term in the lease, for operators

    async def _renew(self) -> None:
        held = self._held
        if held is None:
            return
        sent = self._clock()
        try:
            revision = await self._write(self._value(held.term), last=held.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._lose("renewal refused: the lease changed hands")
            return
        except Exception as exc:  # NATS away: keep trying until the fence
            self._log.warning("cannot renew the lease", error=str(exc))
            return
        if self._held is held:
            self._held = replace(held, revision=revision, renewed_at=sent)
            self._seen = Seen(self.holder, revision)

    def _lose(self, reason: str, *, expected: bool = False) -> None:
        held, self._held = self._held, None
        self._reason = reason
        self._elected.clear()
        self._deposed.set()
        if held is not None:
            log = self._log.info if expected else self._log.warning
            log("stepped down" if expected else "lost leadership", term=held.term, reason=reason)


async def follow(election: LeaderElection, *, lead: Callable[[int], Awaitable[None]],
                 abdicate: Callable[[str], Awaitable[None]]) -> asyncio.Task[None]:
    """Run ``lead(term)`` each time this replica is elected and
    ``abdicate(reason)`` each time it loses the lease. Leads before returning
    when already elected (so a service's start() returns a working leader),
    then follows in the returned task. A leader that cannot start resigns,
    so another replica can try."""
    log = get_logger(component="leader", role=election.role)

    async def lead_term(term: int) -> None:
        try:
            await lead(term)
        except NotLeader:
            pass  # lost the lease while starting: abdicate below
        except Exception as exc:
            log.exception("cannot lead; resigning", term=term)
            await election.resign(f"leading failed: {exc!r}"[:300])

    async def loop(term: int | None) -> None:
        while True:
            if term is None:
                await lead_term(await election.wait_elected())
            reason = await election.wait_deposed()
            try:
                await abdicate(reason)
            except Exception:
                # The follower must live on to lead the next term; a dead
                # one keeps renewing the lease and never leads again.
                log.exception("abdicating failed", reason=reason)
            term = None

    first: int | None = None
    if election.is_leader:
        first = election.check()
        await lead_term(first)
    return asyncio.create_task(loop(first), name=f"follow:{election.role}")
