"""Alert delivery decisions (pure): which receivers an alert goes to, what
Alertmanager and a webhook are sent, how the body is signed, whether an
Alertmanager silence covers it, and when a failed send is tried again.

No I/O and no clock: the shell (``deliverer``) passes the time and the
random source in. An alert here is ``AlertFacts``, converted from the
``lens.alert`` event in exactly one place (``facts_of``).

The webhook body (README, "Alert delivery") is JSON, version 1; the header
``X-Primus-Signature: t=<unix seconds>,v1=<hex>`` carries HMAC-SHA256 of
``<t>.<raw body>`` under the receiver's shared secret, as Stripe and GitHub
sign theirs: a receiver recomputes it over the bytes it got, compares in
constant time and refuses a stale ``t`` (``verify_signature``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from libs.events import LensAlert
from services.lens_collector.delivery_config import Backoff, DeliveryConfig, Matcher

Outcome = Literal["queued", "delivered", "failed", "gave_up", "silenced", "skipped"]
SIGNATURE_HEADER = "X-Primus-Signature"
DELIVERY_HEADER = "X-Primus-Delivery"
WEBHOOK_VERSION = 1
# Alertmanager resolves a firing alert whose endsAt passed: a few re-send
# intervals ahead, as Prometheus does, so a dead collector's alerts resolve.
ENDS_AT_INTERVALS = 4
SIGNATURE_TOLERANCE_S = 300.0


@dataclass(frozen=True)
class AlertFacts:
    """One transition of one alert, with the workspace of its job."""

    alert_id: str
    event_id: str
    rule: str
    state: Literal["open", "closed"]
    severity: str
    subject_key: str
    opened_at: float  # epoch seconds
    at: float  # when it opened or closed
    node: str | None = None
    job: str | None = None
    workspace: str | None = None
    gpu: int | None = None
    value: float | None = None
    threshold: float | None = None
    message: str = ""
    fault_class: str | None = None


def facts_of(event: LensAlert, workspace: str | None = None) -> AlertFacts:
    d = event.data
    return AlertFacts(alert_id=d.alert_id, event_id=event.id, rule=d.rule, state=d.state,
                      severity=d.severity, subject_key=d.subject_key,
                      opened_at=d.opened_at.timestamp(), at=event.time.timestamp(),
                      node=event.node, job=event.job, workspace=workspace or None, gpu=d.gpu,
                      value=d.value, threshold=d.threshold, message=d.message,
                      fault_class=d.fault_class)


def labels(alert: AlertFacts) -> dict[str, str]:
    """The alert's labels (Alertmanager's identity of it; routes and silences
    match on them). Empty ones are left out, as Alertmanager treats a
    missing label and an empty one alike. Only what the ``alerts`` table
    keeps: a re-sent alert must carry the very labels it first had."""
    out = {"alertname": alert.rule, "rule": alert.rule, "severity": alert.severity,
           "node": alert.node or "", "job": alert.job or "", "workspace": alert.workspace or "",
           "gpu": "" if alert.gpu is None else str(alert.gpu), "subject": alert.subject_key,
           "source": "primus-lens"}
    return {k: v for k, v in out.items() if v}


# --------------------------------------------------------------------------- matching


def matches(matcher: Matcher, labelset: Mapping[str, str]) -> bool:
    """As Alertmanager: a missing label is the empty string; regexes are anchored."""
    value = labelset.get(matcher.name, "")
    if matcher.is_regex:
        hit = re.fullmatch(matcher.value, value) is not None
    else:
        hit = value == matcher.value
    return hit == matcher.is_equal


def matches_all(matchers: Iterable[Matcher], labelset: Mapping[str, str]) -> bool:
    return all(matches(m, labelset) for m in matchers)


def route(config: DeliveryConfig, labelset: Mapping[str, str]) -> list[str]:
    """The receivers (names, in order, once each) an alert goes to."""
    if not config.routes:
        return [r.name for r in config.receivers]
    out: list[str] = []
    for r in config.routes:
        if matches_all(r.parsed(), labelset):
            out += r.receivers
            if not r.continue_:
                break
    if not out:
        out = ([r.name for r in config.receivers] if config.default_receivers is None
               else list(config.default_receivers))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    ends_at: str = ""
    comment: str = ""


def active_silences(doc: Any) -> list[Silence]:
    """The active silences in Alertmanager's GET /api/v2/silences reply."""
    out: list[Silence] = []
    for s in doc if isinstance(doc, list) else []:
        if not isinstance(s, dict) or (s.get("status") or {}).get("state") != "active":
            continue
        try:
            matchers = tuple(Matcher(name=m["name"], value=m["value"],
                                     is_regex=bool(m.get("isRegex", False)),
                                     is_equal=bool(m.get("isEqual", True)))
                             for m in s.get("matchers", []))
        except (KeyError, TypeError, ValueError):
            continue  # one we cannot read silences nothing
        out.append(Silence(str(s.get("id", "")), matchers, str(s.get("endsAt", "")),
                           str(s.get("comment", ""))))
    return out


def silenced_by(silences: Iterable[Silence], labelset: Mapping[str, str]) -> Silence | None:
    """The first active silence covering the alert (every matcher matches)."""
    for s in silences:
        try:
            if s.matchers and matches_all(s.matchers, labelset):
                return s
        except re.error:
            continue
    return None


# --------------------------------------------------------------------------- payloads


def link(config: DeliveryConfig, alert: AlertFacts) -> str | None:
    """The alert's dashboard: the job's (dashboard_url) or the node's."""
    template = (config.dashboard_url if alert.job else None) or (
        config.node_dashboard_url if alert.node else None)
    if template is None:
        return None
    values = {"job": alert.job or "", "node": alert.node or "", "rule": alert.rule,
              "workspace": alert.workspace or "", "alert_id": alert.alert_id,
              "gpu": "" if alert.gpu is None else str(alert.gpu)}
    return template.format(**values)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def alertmanager_alert(alert: AlertFacts, *, url: str | None, now: float,
                       resend_interval_s: float) -> dict[str, Any]:
    """One alert of a POST /api/v2/alerts body: firing (endsAt a few re-send
    intervals ahead) or resolved (endsAt when it closed)."""
    ends = alert.at if alert.state == "closed" else now + ENDS_AT_INTERVALS * resend_interval_s
    annotations = {"summary": f"{alert.rule} on {alert.subject_key}",
                   "description": alert.message or alert.rule, "alert_id": alert.alert_id}
    if alert.value is not None:
        annotations["value"] = f"{alert.value:g}"
    if alert.threshold is not None:
        annotations["threshold"] = f"{alert.threshold:g}"
    if alert.fault_class:
        annotations["fault_class"] = alert.fault_class
    body: dict[str, Any] = {"labels": labels(alert), "annotations": annotations,
                            "startsAt": iso(alert.opened_at), "endsAt": iso(max(ends,
                                                                               alert.opened_at))}
    if url:
        body["generatorURL"] = url
    return body


def webhook_body(alert: AlertFacts, *, receiver: str, delivery_id: str,
                 url: str | None) -> bytes:
    """The webhook's JSON body (the same bytes on every attempt)."""
    doc = {
        "version": WEBHOOK_VERSION,
        "delivery_id": delivery_id,
        "receiver": receiver,
        "status": "firing" if alert.state == "open" else "resolved",
        "alert": {
            "id": alert.alert_id, "rule": alert.rule, "state": alert.state,
            "severity": alert.severity, "subject": alert.subject_key, "node": alert.node,
            "job": alert.job, "workspace": alert.workspace, "gpu": alert.gpu,
            "value": alert.value, "threshold": alert.threshold, "message": alert.message,
            "fault_class": alert.fault_class, "opened_at": iso(alert.opened_at),
            "closed_at": iso(alert.at) if alert.state == "closed" else None,
            "labels": labels(alert), "dashboard_url": url,
        },
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: bytes, body: bytes, timestamp: int) -> str:
    """The X-Primus-Signature header: ``t=<unix seconds>,v1=<hex HMAC-SHA256
    of "<t>." + body>``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_signature(secret: bytes, body: bytes, header: str, *, now: float,
                     tolerance_s: float = SIGNATURE_TOLERANCE_S) -> bool:
    """What a receiver does: recompute over the raw body, compare in constant
    time, refuse a timestamp further than ``tolerance_s`` from ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - t) > tolerance_s:
        return False
    expected = signature(secret, body, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


# --------------------------------------------------------------------------- retries


def delivery_id(alert: AlertFacts, receiver: str) -> str:
    """The same for every attempt (and every replica) of one transition to
    one receiver: the deliveries table and the receiver de-duplicate on it."""
    return hashlib.sha256(f"{alert.alert_id}|{alert.state}|{receiver}".encode()
                          ).hexdigest()[:24]


def retryable(status: int | None) -> bool:
    """A connection error, a timeout, 408, 429 and 5xx are worth another try;
    any other 4xx means the request itself is wrong."""
    return status is None or status in (408, 429) or status >= 500


def retry_delay(attempt: int, backoff: Backoff, rand: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): exponential,
    capped, with +/- jitter."""
    base = min(backoff.max_s, backoff.initial_s * backoff.multiplier ** (attempt - 1))
    spread = (rand or random).uniform(-backoff.jitter, backoff.jitter)
    return max(0.0, base * (1 + spread))


def after_failure(attempt: int, max_attempts: int | None, status: int | None, *,
                  age_s: float = 0.0, give_up_after_s: float = float("inf")) -> Outcome:
    """What a failed attempt is recorded as: ``failed`` (another try comes) or
    ``gave_up``: the request itself is wrong, the attempts are spent, or the
    transition (``age_s`` old) is older than ``give_up_after_s``. Without
    ``max_attempts`` a receiver that is away is tried until it is back: an
    outage of a webhook loses no alert, only delays it."""
    if not retryable(status) or age_s >= give_up_after_s:
        return "gave_up"
    return "failed" if max_attempts is None or attempt < max_attempts else "gave_up"
