"""Alert delivery's pure core: routing and matchers as scenarios-as-data, the
Alertmanager and webhook payloads, the signature, the retry schedule, and
the receivers file's errors (file, field, fix)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from libs.events import LensAlert, LensAlertData
from libs.specs import SpecError
from services.lens_collector.delivery import (
    ENDS_AT_INTERVALS,
    AlertFacts,
    active_silences,
    after_failure,
    alertmanager_alert,
    delivery_id,
    facts_of,
    labels,
    link,
    matches,
    retry_delay,
    route,
    signature,
    silenced_by,
    verify_signature,
    webhook_body,
)
from services.lens_collector.delivery_config import (
    Backoff,
    DeliveryConfig,
    Receiver,
    load_delivery,
    parse_matcher,
)

ALERT = AlertFacts(alert_id="a1", event_id="a1-open", rule="gpu_temp_high", state="open",
                   severity="critical", subject_key="gpu-3/gpu2", opened_at=1000.0, at=1000.0,
                   node="gpu-3", job="train-7b", workspace="research", gpu=2, value=91.0,
                   threshold=80.0, message="GPU 2 at 91 C")
CONFIG = DeliveryConfig.model_validate({
    "receivers": [{"name": "am", "kind": "alertmanager", "url": "http://am:9093/"},
                  {"name": "pager", "kind": "webhook", "url": "https://pager.example/hook",
                   "secret": {"env": "PAGER_SECRET"}},
                  {"name": "research", "kind": "webhook", "url": "https://r.example/hook",
                   "secret": {"file": "/secrets/research/hmac"}}],
    "routes": [{"matchers": ["severity=critical"], "receivers": ["pager", "am"],
                "continue": True},
               {"matchers": ["workspace=~research|vision"], "receivers": ["research"]},
               {"matchers": ["rule=~gpu_.*"], "receivers": ["am"]}],
    "default_receivers": ["am"],
    "dashboard_url": "https://grafana.example/d/primus-job?var-job={job}",
    "node_dashboard_url": "https://grafana.example/d/primus-node?var-node={node}",
    "resend_interval_s": 60,
})


def alert(**changes: object) -> AlertFacts:
    return AlertFacts(**{**ALERT.__dict__, **changes})  # type: ignore[arg-type]


# (what changes in the alert, the receivers it goes to)
ROUTING: list[tuple[dict[str, object], list[str]]] = [
    ({}, ["pager", "am", "research"]),  # critical continues; research stops the search
    ({"severity": "warning"}, ["research"]),
    ({"severity": "warning", "workspace": None}, ["am"]),  # rule=~gpu_.*
    ({"severity": "warning", "workspace": "prod", "rule": "job_hang"}, ["am"]),  # default
    ({"severity": "warning", "workspace": "research-2"}, ["am"]),  # regexes are anchored
]


@pytest.mark.parametrize(("changes", "receivers"), ROUTING)
def test_routes_pick_receivers_in_order(changes: dict[str, object],
                                        receivers: list[str]) -> None:
    assert route(CONFIG, labels(alert(**changes))) == receivers


def test_without_routes_every_receiver_gets_every_alert() -> None:
    config = CONFIG.model_copy(update={"routes": [], "default_receivers": None})
    assert route(config, labels(ALERT)) == ["am", "pager", "research"]
    none = CONFIG.model_copy(update={"routes": [CONFIG.routes[0]], "default_receivers": []})
    assert route(none, labels(alert(severity="info"))) == []


@pytest.mark.parametrize(("text", "labelset", "hit"), [
    ("node=gpu-3", {"node": "gpu-3"}, True),
    ("node!=gpu-3", {"node": "gpu-3"}, False),
    ("node!=gpu-3", {}, True),  # a missing label is ""
    ("job=", {}, True),
    ("severity=~critical|warning", {"severity": "warning"}, True),
    ("severity=~crit", {"severity": "critical"}, False),  # anchored, as Alertmanager
    ("severity!~info", {"severity": "critical"}, True),
    ('node="gpu-3"', {"node": "gpu-3"}, True),  # quotes are taken off
])
def test_matchers_as_alertmanager_evaluates_them(text: str, labelset: dict[str, str],
                                                 hit: bool) -> None:
    assert matches(parse_matcher(text), labelset) is hit


@pytest.mark.parametrize("bad", ["node", "=x", "node=~(", "1node=x", "node~x"])
def test_a_bad_matcher_says_what_to_write(bad: str) -> None:
    with pytest.raises(ValueError, match="matcher|regular expression"):
        parse_matcher(bad)


def test_alertmanager_alert_firing_and_resolved() -> None:
    url = link(CONFIG, ALERT)
    assert url == "https://grafana.example/d/primus-job?var-job=train-7b"
    firing = alertmanager_alert(ALERT, url=url, now=2000.0, resend_interval_s=60)
    assert firing["labels"] == {"alertname": "gpu_temp_high", "rule": "gpu_temp_high",
                                "severity": "critical", "node": "gpu-3", "job": "train-7b",
                                "workspace": "research", "gpu": "2", "subject": "gpu-3/gpu2",
                                "source": "primus-lens"}
    assert firing["generatorURL"] == url
    assert firing["startsAt"] == "1970-01-01T00:16:40.000Z"
    ends = datetime.fromisoformat(firing["endsAt"].replace("Z", "+00:00")).timestamp()
    assert ends == 2000.0 + ENDS_AT_INTERVALS * 60  # resolves by itself if never re-sent
    assert firing["annotations"]["description"] == "GPU 2 at 91 C"
    resolved = alertmanager_alert(alert(state="closed", at=1500.0), url=url, now=2000.0,
                                  resend_interval_s=60)
    assert resolved["endsAt"] == "1970-01-01T00:25:00.000Z"
    assert resolved["labels"] == firing["labels"]  # the same alert to Alertmanager
    node_alert = alert(job=None, workspace=None, rule="node_down")
    assert link(CONFIG, node_alert) == "https://grafana.example/d/primus-node?var-node=gpu-3"
    assert "job" not in labels(node_alert) and "workspace" not in labels(node_alert)


def test_webhook_body_and_signature_verify_and_tampering_fails() -> None:
    body = webhook_body(ALERT, receiver="pager", delivery_id="d1", url=link(CONFIG, ALERT))
    doc = json.loads(body)
    assert doc["version"] == 1 and doc["status"] == "firing" and doc["delivery_id"] == "d1"
    assert doc["alert"]["node"] == "gpu-3" and doc["alert"]["workspace"] == "research"
    assert doc["alert"]["dashboard_url"].endswith("var-job=train-7b")
    header = signature(b"s3cret", body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify_signature(b"s3cret", body, header, now=1_700_000_010)
    assert not verify_signature(b"other", body, header, now=1_700_000_010)
    assert not verify_signature(b"s3cret", body + b" ", header, now=1_700_000_010)
    assert not verify_signature(b"s3cret", body, header, now=1_700_001_000)  # replayed late
    assert not verify_signature(b"s3cret", body, "garbage", now=1_700_000_010)
    # the same bytes on every attempt: a receiver de-duplicates on delivery_id
    assert body == webhook_body(ALERT, receiver="pager", delivery_id="d1",
                                url=link(CONFIG, ALERT))


def test_delivery_ids_are_per_transition_and_receiver() -> None:
    ids = {delivery_id(ALERT, "am"), delivery_id(ALERT, "pager"),
           delivery_id(alert(state="closed"), "am")}
    assert len(ids) == 3 and delivery_id(ALERT, "am") == delivery_id(ALERT, "am")


def test_retry_schedule_is_exponential_capped_and_jittered() -> None:
    plain = Backoff(initial_s=1, multiplier=2, max_s=10, jitter=0)
    assert [retry_delay(n, plain) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    jittered = Backoff(initial_s=4, multiplier=2, max_s=60, jitter=0.25)
    rand = random.Random(7)
    delays = [retry_delay(1, jittered, rand) for _ in range(200)]
    assert min(delays) >= 3 and max(delays) <= 5 and len(set(delays)) > 100
    assert after_failure(1, 3, None) == "failed"  # refused or timed out: again
    assert after_failure(2, 3, 503) == "failed"
    assert after_failure(3, 3, 503) == "gave_up"  # out of attempts
    assert after_failure(1, 3, 400) == "gave_up"  # the request is wrong: no retry fixes it
    assert after_failure(1, 3, 429) == "failed"


def test_without_max_attempts_a_receiver_that_is_away_is_tried_until_the_alert_is_stale(
        ) -> None:
    assert after_failure(1000, None, None, age_s=3600, give_up_after_s=86_400) == "failed"
    assert after_failure(50, None, 503, age_s=86_399, give_up_after_s=86_400) == "failed"
    assert after_failure(51, None, 503, age_s=86_400, give_up_after_s=86_400) == "gave_up"
    assert after_failure(1, None, 404, age_s=0, give_up_after_s=86_400) == "gave_up"
    assert Receiver(name="r", kind="alertmanager", url="http://am:9093").max_attempts is None


def test_silences_from_the_api_cover_matching_alerts() -> None:
    doc = [{"id": "s1", "status": {"state": "active"}, "endsAt": "2030-01-01T00:00:00Z",
            "matchers": [{"name": "node", "value": "gpu-3", "isRegex": False, "isEqual": True},
                         {"name": "severity", "value": "critical|warning", "isRegex": True}]},
           {"id": "s2", "status": {"state": "expired"},
            "matchers": [{"name": "node", "value": ".*", "isRegex": True}]},
           {"id": "s3", "status": {"state": "active"}, "matchers": "junk"}]
    silences = active_silences(doc)
    assert [s.id for s in silences] == ["s1"]
    hit = silenced_by(silences, labels(ALERT))
    assert hit is not None and hit.id == "s1"
    assert silenced_by(silences, labels(alert(node="gpu-4"))) is None
    assert silenced_by(silences, labels(alert(severity="info"))) is None


def test_facts_come_from_the_event() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = LensAlert(source="lens-collector", node="gpu-3", job="j1", time=at, data=LensAlertData(
        alert_id="x", rule="log_rccl_error", state="open", severity="critical",
        subject_key="j1", opened_at=at, fault_class="infra"))
    facts = facts_of(event, "research")
    assert (facts.node, facts.job, facts.workspace, facts.at) == ("gpu-3", "j1", "research",
                                                                  at.timestamp())
    assert alertmanager_alert(facts, url=None, now=at.timestamp(), resend_interval_s=60
                              )["annotations"]["fault_class"] == "infra"


# --------------------------------------------------------------------------- the file


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "receivers.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "field", "fix"), [
    ("receivers:\n  - {name: am, kind: alertmanager, url: am:9093}\n",
     "receivers.0.url", "write e.g. http://"),
    ("receivers:\n  - {name: hook, kind: webhook, url: 'http://h', secret: abc}\n",
     "receivers.0.secret", "write a mapping"),
    ("receivers:\n  - {name: hook, kind: webhook, url: 'http://h'}\n",
     "receivers.0", "add secret:"),
    ("receivers:\n  - {name: hook, kind: webhook, url: 'http://h', secret: {env: X, file: /f}}\n",
     "receivers.0.secret", "exactly one"),
    ("receivers:\n  - {name: am, kind: alertmanager, url: 'http://am'}\n"
     "routes:\n  - {matchers: [severity=critical], receivers: [pager]}\n",
     "routes.0.receivers", "add it under receivers"),
    ("receivers:\n  - {name: am, kind: alertmanager, url: 'http://am'}\n"
     "routes:\n  - {matchers: ['severity=~('], receivers: [am]}\n",
     "routes.0.matchers", "fix the pattern"),
    ("receivers:\n  - {name: am, kind: alertmanager, url: 'http://am', timeout: 3}\n",
     "receivers.0.timeout", "check its spelling"),
    ("dashboard_url: 'https://g/d?var-job={jobid}'\n", "dashboard_url", "use only"),
    ("receivers:\n  - {name: hook, kind: webhook, url: 'http://h', secret: {env: NOPE_SECRET}}\n",
     "receivers.0.secret.env", "set it"),
    ("receivers:\n  - {name: hook, kind: webhook, url: 'http://h', "
     "secret: {file: /nonexistent/hmac}}\n", "receivers.0.secret.file", "mount the Secret"),
])
def test_a_bad_receivers_file_names_file_field_and_fix(tmp_path: Path, text: str, field: str,
                                                       fix: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as err:
        load_delivery(path, env={})
    message = str(err.value)
    assert str(path) in message and field in message and fix in message, message


def test_a_good_file_loads_with_its_secrets(tmp_path: Path) -> None:
    secret = tmp_path / "hmac"
    secret.write_text("from-a-file\n")
    path = write(tmp_path, f"""receivers:
  - {{name: am, kind: alertmanager, url: "http://am:9093"}}
  - {{name: pager, kind: webhook, url: "https://p/hook", secret: {{env: PAGER}}}}
  - {{name: files, kind: webhook, url: "https://f/hook", secret: {{file: {secret}}},
     max_attempts: 8, backoff: {{initial_s: 0.5, max_s: 30}}}}
routes:
  - {{matchers: ["severity=critical"], receivers: [pager], continue: true}}
""")
    config, secrets = load_delivery(path, env={"PAGER": "from-env"})
    assert secrets == {"pager": b"from-env", "files": b"from-a-file"}
    assert config.routes[0].continue_ and config.receiver("files").max_attempts == 8
    assert [r.name for r in config.alertmanagers] == ["am"]
