"""The NATS auth callout: who may connect as a job (a thin shell).

nats-server sends every client that is not a platform service user to
``$SYS.REQ.USER.AUTH``; every scheduler replica, leader or standby, answers
in one queue group. A valid job credential (``libs.job_credentials``) of a
job whose record in the ``jobs`` bucket says its workers may run gets a
user JWT holding the job to its own subjects, expiring after
``Settings.job_credential_ttl_s``; a wrong password, an unknown or ended
job, and a client without credentials are refused with the reason, which
is logged here and returned in the response's error (the server logs it
too). The decision is ``libs.job_credentials.authorize`` (pure); this file
only reads the job's status and sends the answer. No secret is logged.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from libs.bus import Bus
from libs.job_credentials import (
    CALLOUT_QUEUE,
    CALLOUT_SUBJECT,
    AuthRequest,
    Refused,
    authorize,
    issuer_keypair,
    requested_job,
)
from libs.kv import Records
from libs.logs import get_logger
from libs.records import JOBS, JobRecord
from libs.settings import Settings


class AuthCallout:
    def __init__(self, settings: Settings) -> None:
        assert settings.nats_callout_seed is not None
        self.issuer = issuer_keypair(settings.nats_callout_seed.get_secret_value())
        key = settings.job_credential_key
        self.key = key.get_secret_value().encode() if key is not None else b""
        self.ttl_s = settings.job_credential_ttl_s
        self.jobs: Records[JobRecord] | None = None
        self.sub: Any = None
        self.allowed = 0
        self.refused = 0
        self._log = get_logger(component="auth-callout")

    async def start(self, bus: Bus) -> None:
        # Its own reader: the leader's Records tracks revisions for its writes.
        self.jobs = await bus.records(JOBS)
        self.sub = await bus.nc.subscribe(CALLOUT_SUBJECT, queue=CALLOUT_QUEUE, cb=self._on)
        await bus.flush()
        self._log.info("answering the NATS auth callout", ttl_s=self.ttl_s,
                       keyed=bool(self.key))

    async def stop(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):  # the connection is gone already
                await self.sub.unsubscribe()
            self.sub = None

    async def status(self, job: str) -> str | None:
        assert self.jobs is not None
        try:
            record = await self.jobs.get(job)
        except ValueError:  # a record this release cannot read: not a live job to us
            return None
        return record.status if record is not None else None

    async def _on(self, msg: Any) -> None:
        try:
            request = AuthRequest.parse(msg.data.decode(errors="replace"))
        except Refused as exc:  # not the server's request: nothing to answer for
            self._log.warning("auth callout request unreadable", error=str(exc))
            return
        job = requested_job(request)
        try:
            status = await self.status(job) if job else None
        except Exception as exc:  # the bucket is away: the server retries the client
            self._log.error("auth callout cannot read the job", job=job, error=str(exc))
            return
        decision = authorize(request, key=self.key, issuer=self.issuer, status=status,
                             now=int(time.time()), ttl_s=self.ttl_s)
        if decision.error is None:
            self.allowed += 1
            self._log.info("job connection allowed", job=decision.job, client=request.client,
                           ttl_s=self.ttl_s)
        else:
            self.refused += 1
            self._log.warning("nats connection refused", job=job, client=request.client,
                              user=request.user, reason=decision.error)
        if msg.reply:
            await msg.respond(decision.response.encode())
