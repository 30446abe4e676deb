"""Per-job NATS credentials, answered by an auth callout (no unauthenticated user).

Every job gets its own NATS credential: user ``job:<job>`` and a password
that is an HMAC of the job id under a cluster secret key
(``Settings.job_credential_key``), so any scheduler replica can check one
without state. The drivers hand it to the job's workers (the local driver as
environment variables, the Kubernetes driver through a per-job Secret); the
SDK connects with it (``WORKER_ENV_USER``/``WORKER_ENV_PASSWORD``).

nats-server knows only the platform's own users (``auth_users``); every
other client is sent to the auth callout (``$SYS.REQ.USER.AUTH``) that the
scheduler answers (``services/scheduler/callout.py``). The answer for a
valid credential of a live job is a user JWT, signed with the callout's
account nkey (``Settings.nats_callout_seed``), that allows publishing only
the job's own subjects (derived from the SDK's route table,
``libs.sdk.ROUTES``) and receiving only the replies to its own publishes
(its own inbox prefix); it expires after ``ttl_s``, when the server closes
the connection and the worker's reconnect is checked again: an ended job's
connection is cut within that bound and it cannot connect again.

Everything here is pure: the claim formats follow nats-server's auth
callout (ADR-26, config mode): an authorization request JWT signed by the
server, answered with an authorization response JWT signed by the issuer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import nkeys

from libs.events import KEY_PATTERN
from libs.nats_permissions import CALLOUT_SUBJECT, Permissions
from libs.sdk import ROUTES as TRAINER
from libs.sdk import job_inbox, job_subject

# The environment variables a worker gets its job's credential in (both
# drivers set them; libs.sdk reads them through libs.worker_env.WorkerEnv).
from libs.worker_env import WORKER_ENV_PASSWORD, WORKER_ENV_USER

__all__ = ["CALLOUT_SUBJECT", "WORKER_ENV_PASSWORD", "WORKER_ENV_USER", "JobCredential",
           "authorize", "credential", "job_of", "job_permissions"]

USER_PREFIX = "job:"  # service user names never hold a colon
CALLOUT_QUEUE = "primus-auth-callout"  # every scheduler replica answers, one per request
ACCOUNT = "$G"  # config mode without accounts: every user is in the global account
# Job statuses whose workers may talk: placed or queued (the record says
# running only after the launch), and stopping (flushing before they exit).
# Ended (stopped, completed, failed, cancelled) or unknown jobs are refused.
LIVE_STATUSES = frozenset({"pending", "running", "stopping"})
DEFAULT_TTL_S = 300
_CONTEXT = b"primus-safe/job-nats-credential/v1:"
_KEY_RE = re.compile(KEY_PATTERN)


@dataclass(frozen=True)
class JobCredential:
    """A job's NATS user and password (the password never in a repr)."""

    user: str
    password: str = field(repr=False)

    def as_env(self) -> dict[str, str]:
        """The worker's environment variables for it."""
        return {WORKER_ENV_USER: self.user, WORKER_ENV_PASSWORD: self.password}


class Refused(ValueError):
    """A connection the callout refuses; the message is the reason (no secret in it)."""


def _password(key: bytes, job: str) -> str:
    digest = hmac.new(key, _CONTEXT + job.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def credential(key: bytes, job: str) -> JobCredential:
    """The credential of ``job`` under the cluster key (the same on every call)."""
    if not key:
        raise ValueError("no job credential key: set PRIMUS_JOB_CREDENTIAL_KEY")
    if not _KEY_RE.match(job):
        raise ValueError(f"job id {job!r} is not a subject key ({KEY_PATTERN})")
    return JobCredential(USER_PREFIX + job, _password(key, job))


def job_of(key: bytes, user: str | None, password: str | None) -> str:
    """The job a credential belongs to; Refused (with the reason) when it is
    not a job credential or its password is wrong."""
    if not user:
        raise Refused("no credentials: every client needs a user (jobs: their job credential)")
    if not user.startswith(USER_PREFIX):
        raise Refused(f"user {user!r} is not a job credential")
    job = user[len(USER_PREFIX):]
    if not _KEY_RE.match(job):
        raise Refused(f"user {user!r} does not name a valid job id")
    if not key or not hmac.compare_digest(_password(key, job), password or ""):
        raise Refused(f"wrong password for job {job}")
    return job


def check_live(job: str, status: str | None) -> None:
    """Refused unless the job's record says its workers may run."""
    if status is None:
        raise Refused(f"job {job} is unknown (never submitted, or deleted)")
    if status not in LIVE_STATUSES:
        raise Refused(f"job {job} has ended ({status}): its credential is revoked")


def job_permissions(job: str) -> Permissions:
    """What a job's workers may do: publish the SDK's events on the job's own
    subjects (from ``libs.sdk.ROUTES``) and receive their JetStream acks on
    the job's own inbox prefix. Nothing else."""
    if not _KEY_RE.match(job):
        raise ValueError(f"job id {job!r} is not a subject key")
    pub = tuple(dict.fromkeys(job_subject(cls, job) for cls in TRAINER.publishes))
    return Permissions(publish_allow=pub, publish_deny=(),
                       subscribe_allow=(f"{job_inbox(job)}.>",), allow_responses=False)


# --------------------------------------------------------------------------- keys and JWTs


def issuer_keypair(secret: str) -> nkeys.KeyPair:
    """The callout's account nkey: ``secret`` is an account seed (``SA...``)
    or any other secret string, from which one is derived (sha256), so a Helm
    chart can generate it as a plain random string."""
    text = secret.strip()
    if text.startswith("SA"):
        try:
            return nkeys.from_seed(bytearray(text.encode()))
        except Exception:
            pass  # not a seed after all: derive one from it
    raw = hashlib.sha256(b"primus-safe/nats-callout-issuer:" + text.encode()).digest()
    return nkeys.from_seed(bytearray(nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_ACCOUNT)))


def issuer_public_key(secret: str) -> str:
    """The ``issuer`` nats-server's ``auth_callout`` block names."""
    return issuer_keypair(secret).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_HEADER = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())


def encode_jwt(claims: Mapping[str, Any], kp: nkeys.KeyPair) -> str:
    """A NATS JWT: the claims with ``iss`` and ``jti`` filled in, signed by ``kp``."""
    body = dict(claims)
    body["iss"] = kp.public_key.decode()
    body.pop("jti", None)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_HEADER}.{_b64(json.dumps(body, separators=(',', ':')).encode())}"
    return f"{signing_input}.{_b64(kp.sign(signing_input.encode()))}"


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a JWT (its signature not checked: the authorization
    request reaches the callout on a subject only the server publishes)."""
    try:
        _, body, _ = token.strip().split(".")
        claims = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(f"not a JWT: {exc}") from None
    if not isinstance(claims, dict):
        raise Refused("not a JWT: its claims are not an object")
    return claims


@dataclass(frozen=True)
class AuthRequest:
    """What the callout needs of nats-server's authorization request."""

    server_id: str
    user_nkey: str
    user: str | None
    password: str | None
    client: str  # for the log: host and connection name

    @classmethod
    def parse(cls, token: str) -> AuthRequest:
        claims = decode_jwt(token)
        nats = claims.get("nats") or {}
        if nats.get("type") != "authorization_request":
            raise Refused(f"not an authorization request ({nats.get('type')!r})")
        opts, info = nats.get("connect_opts") or {}, nats.get("client_info") or {}
        server_id, user_nkey = (nats.get("server_id") or {}).get("id"), nats.get("user_nkey")
        if not server_id or not user_nkey:
            raise Refused("authorization request without a server id or user nkey")
        return cls(server_id=server_id, user_nkey=user_nkey, user=opts.get("user"),
                   password=opts.get("pass"),
                   client=f"{info.get('host', '?')} {info.get('name') or ''}".strip())


def user_claims(job: str, user_nkey: str, *, now: int, ttl_s: int) -> dict[str, Any]:
    """The user JWT's claims for a job's worker: its permissions, expiring
    after ``ttl_s`` (the bound on how long an ended job stays connected)."""
    p = job_permissions(job)
    return {
        "sub": user_nkey, "aud": ACCOUNT, "name": USER_PREFIX + job, "iat": now,
        "exp": now + ttl_s,
        "nats": {"pub": {"allow": list(p.publish_allow)},
                 "sub": {"allow": list(p.subscribe_allow)},
                 "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2},
    }


def response_claims(request: AuthRequest, *, now: int, user_jwt: str | None = None,
                    error: str | None = None) -> dict[str, Any]:
    """The authorization response: the user JWT, or the reason it is refused."""
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if user_jwt is not None:
        nats["jwt"] = user_jwt
    if error is not None:
        nats["error"] = error
    return {"sub": request.user_nkey, "aud": request.server_id, "iat": now, "nats": nats}


@dataclass(frozen=True)
class Decision:
    job: str | None  # the job, when the credential names one
    error: str | None  # None: allowed
    response: str  # the signed authorization response JWT


def authorize(request: AuthRequest, *, key: bytes, issuer: nkeys.KeyPair,
              status: str | None, now: int, ttl_s: int = DEFAULT_TTL_S) -> Decision:
    """The callout's answer to ``request``, given the status of the job its
    credential names (``status``: the jobs bucket's record, None when there
    is none). Pure: the shell looks the status up and sends the response."""
    job: str | None = None
    try:
        job = job_of(key, request.user, request.password)
        check_live(job, status)
    except Refused as exc:
        error = str(exc)
        return Decision(job, error, encode_jwt(
            response_claims(request, now=now, error=error), issuer))
    user_jwt = encode_jwt(user_claims(job, request.user_nkey, now=now, ttl_s=ttl_s), issuer)
    return Decision(job, None, encode_jwt(
        response_claims(request, now=now, user_jwt=user_jwt), issuer))


def requested_job(request: AuthRequest) -> str | None:
    """The job a request's user names, before any check (to look its status up)."""
    user = request.user or ""
    job = user[len(USER_PREFIX):] if user.startswith(USER_PREFIX) else ""
    return job if _KEY_RE.match(job) else None


def main() -> int:
    """``python -m libs.job_credentials issuer``: the callout issuer's public
    key from ``$PRIMUS_NATS_CALLOUT_SEED`` (the chart's NATS pod runs it in an
    init container: nats-server's config names the key, Helm cannot derive it)."""
    import os
    import sys

    seed = os.environ.get("PRIMUS_NATS_CALLOUT_SEED", "")
    if sys.argv[1:] != ["issuer"] or not seed:
        print("usage: PRIMUS_NATS_CALLOUT_SEED=... python -m libs.job_credentials issuer",
              file=sys.stderr)
        return 2
    print(issuer_public_key(seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
