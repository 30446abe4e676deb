"""libs.job_credentials, pure: credentials, permissions, the callout's claims."""

from __future__ import annotations

import json

import nkeys
import pytest

from libs import job_credentials as jc
from libs.events import JobTelemetry, LogRecord
from libs.nats_permissions import render_callout, render_users
from libs.sdk import ROUTES, job_subject
from libs.worker_env import WorkerEnv

KEY = b"k" * 32
ISSUER = jc.issuer_keypair("a cluster secret")


def test_a_credential_is_stable_per_job_and_key_and_checks() -> None:
    a = jc.credential(KEY, "ja")
    assert a == jc.credential(KEY, "ja")
    assert a.user == "job:ja" and a.password != jc.credential(KEY, "jb").password
    assert a.password != jc.credential(b"other", "ja").password
    assert a.password not in repr(a)
    assert jc.job_of(KEY, a.user, a.password) == "ja"
    assert a.as_env() == {jc.WORKER_ENV_USER: "job:ja", jc.WORKER_ENV_PASSWORD: a.password}


@pytest.mark.parametrize(("user", "password", "reason"), [
    (None, None, "no credentials"),
    ("scheduler", "x", "not a job credential"),
    ("job:a.b", "x", "not name a valid job id"),
    ("job:*", "x", "not name a valid job id"),
    ("job:ja", "wrong", "wrong password for job ja"),
    ("job:ja", None, "wrong password"),
    ("job:jb", jc.credential(KEY, "ja").password, "wrong password for job jb"),
])
def test_a_bad_credential_is_refused_with_its_reason(user: str | None, password: str | None,
                                                      reason: str) -> None:
    with pytest.raises(jc.Refused, match=reason):
        jc.job_of(KEY, user, password)


def test_no_key_no_credential() -> None:
    with pytest.raises(ValueError, match="PRIMUS_JOB_CREDENTIAL_KEY"):
        jc.credential(b"", "ja")
    with pytest.raises(jc.Refused):
        jc.job_of(b"", "job:ja", jc.credential(KEY, "ja").password)
    with pytest.raises(ValueError):
        jc.credential(KEY, "a.>")


@pytest.mark.parametrize(("status", "live"), [
    ("pending", True), ("running", True), ("stopping", True), ("stopped", False),
    ("completed", False), ("failed", False), ("cancelled", False), (None, False)])
def test_only_live_jobs_may_connect(status: str | None, live: bool) -> None:
    if live:
        jc.check_live("ja", status)
    else:
        with pytest.raises(jc.Refused, match="unknown" if status is None else "ended"):
            jc.check_live("ja", status)


def test_a_jobs_permissions_follow_the_sdks_table() -> None:
    p = jc.job_permissions("ja")
    # Its telemetry, its log lines (the SDK's) and its output (its supervisor's).
    assert p.publish_allow == ("safe.telemetry.job.ja", "safe.telemetry.log.job.ja",
                               "safe.telemetry.output.ja")
    assert p.publish_allow == tuple(job_subject(c, "ja") for c in ROUTES.publishes)
    assert p.subscribe_allow == ("_INBOX.job-ja.>",)
    assert not p.allow_responses and not p.publish_deny
    assert job_subject(JobTelemetry, "ja") == JobTelemetry(
        source="x", job="ja", node="n", data={"rank": 0, "attempt": 1, "iteration": 1}).subject
    assert job_subject(LogRecord, "ja").startswith(LogRecord.subject_template.format(root="safe"))


def test_the_generated_users_have_no_trainer_and_a_callout() -> None:
    from cli.catalog import ROLES

    users, callout = render_users(ROLES), render_callout(ROLES)
    assert '"trainer"' not in users and "trainer" not in callout
    assert "issuer: $NATS_CALLOUT_ISSUER" in callout
    for name in ("scheduler", "bench-agent", "cli"):
        assert f'"{name}"' in callout
    scheduler = users.split('user: "scheduler"')[1].split('user: "')[0]
    assert '"$SYS.REQ.USER.AUTH"' in scheduler
    assert users.count('"$SYS.REQ.USER.AUTH"') == 1  # the scheduler alone answers


def test_the_worker_env_carries_the_credential_but_not_in_public() -> None:
    cred = jc.credential(KEY, "ja")
    env = WorkerEnv(job="ja", nats_user=cred.user, nats_password=cred.password)
    assert WorkerEnv.from_env(env.as_env()).nats_password == cred.password
    assert jc.WORKER_ENV_PASSWORD not in env.public_env()
    assert env.public_env()[jc.WORKER_ENV_USER] == "job:ja"


def test_the_issuer_is_an_account_key_from_a_seed_or_any_secret() -> None:
    assert jc.issuer_public_key("x").startswith("A")
    assert jc.issuer_public_key("x") == jc.issuer_public_key("x") != jc.issuer_public_key("y")
    seed = jc.issuer_keypair("x").seed.decode()
    assert seed.startswith("SA") and jc.issuer_public_key(seed) == jc.issuer_public_key("x")


def _request(user: str | None, password: str | None) -> jc.AuthRequest:
    server = nkeys.from_seed(bytearray(nkeys.encode_seed(b"s" * 32, nkeys.PREFIX_BYTE_SERVER)))
    token = jc.encode_jwt({"aud": "nats-authorization-request", "sub": "A", "nats": {
        "type": "authorization_request", "version": 2, "user_nkey": "UXYZ",
        "server_id": {"id": "NSERVER", "name": "s"},
        "connect_opts": {"user": user, "pass": password}, "client_info": {"host": "1.2.3.4"}}},
        server)
    return jc.AuthRequest.parse(token)


def _verified(token: str) -> dict:
    head, body, sig = token.split(".")
    ISSUER.verify(f"{head}.{body}".encode(), jc._unb64(sig))  # raises when it does not match
    assert json.loads(jc._unb64(head)) == {"typ": "JWT", "alg": "ed25519-nkey"}
    return jc.decode_jwt(token)


def test_a_live_jobs_request_gets_a_signed_user_jwt() -> None:
    cred = jc.credential(KEY, "ja")
    request = _request(cred.user, cred.password)
    assert jc.requested_job(request) == "ja"
    d = jc.authorize(request, key=KEY, issuer=ISSUER, status="running", now=1000, ttl_s=60)
    assert d.job == "ja" and d.error is None
    response = _verified(d.response)
    assert response["sub"] == "UXYZ" and response["aud"] == "NSERVER"
    assert response["iss"] == ISSUER.public_key.decode()
    assert response["nats"]["type"] == "authorization_response" and "error" not in response["nats"]
    user = _verified(response["nats"]["jwt"])
    assert user["sub"] == "UXYZ" and user["aud"] == "$G" and user["name"] == "job:ja"
    assert user["exp"] == 1060 and user["iat"] == 1000
    assert user["nats"]["pub"]["allow"] == list(jc.job_permissions("ja").publish_allow)
    assert user["nats"]["sub"]["allow"] == ["_INBOX.job-ja.>"]


@pytest.mark.parametrize(("user", "password", "status", "reason"), [
    ("job:ja", "bad", "running", "wrong password"),
    ("job:ja", None, "completed", "ended"),
    ("job:ja", None, None, "unknown"),
    (None, None, None, "no credentials"),
])
def test_a_refused_request_says_why(user: str | None, password: str | None,
                                    status: str | None, reason: str) -> None:
    good = jc.credential(KEY, "ja").password
    request = _request(user, good if password is None and user else password)
    d = jc.authorize(request, key=KEY, issuer=ISSUER, status=status, now=1000)
    assert d.error is not None and reason in d.error
    response = _verified(d.response)
    assert response["nats"]["error"] == d.error and "jwt" not in response["nats"]
    assert good not in d.error


def test_a_request_that_is_not_one_is_refused() -> None:
    with pytest.raises(jc.Refused):
        jc.AuthRequest.parse("garbage")
    with pytest.raises(jc.Refused, match="not an authorization request"):
        jc.AuthRequest.parse(jc.encode_jwt({"nats": {"type": "user"}}, ISSUER))
