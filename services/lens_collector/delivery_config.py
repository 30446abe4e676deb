"""Where Lens alerts go: the receivers file (PRIMUS_LENS_ALERT_RECEIVERS).

Receivers are Alertmanager instances (its v2 API) and generic webhooks
(a signed JSON body); routes pick receivers by label matchers, written as
Alertmanager writes them (``severity=~critical|warning``, ``node!=gpu-1``).
The file is the chart's ``lens.alertDelivery`` value; its schema
in values.schema.json is this model's (``cli.chart_schema``).

A webhook's HMAC secret is never in the file: it names an environment
variable or a file (a mounted Secret) holding it. Everything is checked at
start-up: a bad file, an unknown receiver in a route, a bad matcher or a
secret that cannot be read stops the collector with the file, the field and
the fix (``libs.specs.SpecError``), never at the first alert.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from libs.specs import SpecError, load_model

# Matchers as Alertmanager writes them: name, operator, value (quotes optional).
_MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$')
# What a link template may name: the alert's labels and its id.
LINK_FIELDS = ("job", "node", "rule", "workspace", "alert_id", "gpu")
RECEIVER_NAME = r"^[a-z0-9]([a-z0-9_.-]{0,61}[a-z0-9])?$"


class Matcher(BaseModel):
    """One label matcher (routes here, silences in Alertmanager)."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: str
    is_regex: bool = False
    is_equal: bool = True

    @property
    def op(self) -> str:
        return {(False, True): "=", (False, False): "!=", (True, True): "=~",
                (True, False): "!~"}[(self.is_regex, self.is_equal)]

    def __str__(self) -> str:
        return f"{self.name}{self.op}{self.value}"


def parse_matcher(text: str) -> Matcher:
    """``name=value``, ``name!=value``, ``name=~regex`` or ``name!~regex``
    (the value may be quoted); ValueError says what to write instead."""
    m = _MATCHER.match(text)
    if m is None:
        raise ValueError(f"matcher {text!r}: write name=value, name!=value, name=~regex or "
                         "name!~regex (e.g. severity=~critical|warning)")
    name, op, value = m.groups()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    regex = op in ("=~", "!~")
    if regex:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"matcher {text!r}: {value!r} is not a regular expression "
                             f"({exc}); fix the pattern") from None
    return Matcher(name=name, value=value, is_regex=regex, is_equal=op in ("=", "=~"))


class Backoff(BaseModel):
    """Retries: ``initial_s`` x ``multiplier``^(attempt-1), at most ``max_s``,
    each spread by +/- ``jitter`` (a fraction) so receivers are not hit in step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_s: float = Field(default=1.0, gt=0, le=3600)
    multiplier: float = Field(default=2.0, ge=1, le=10)
    max_s: float = Field(default=60.0, gt=0, le=86_400)
    jitter: float = Field(default=0.2, ge=0, le=1)


class SecretSource(BaseModel):
    """Where a webhook's HMAC secret is read from: exactly one of ``env`` (an
    environment variable's name) and ``file`` (a path, e.g. a mounted Secret's key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    file: Path | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable's name) and file (a path); "
                             "the secret itself never goes into this file")
        return self


class Receiver(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=RECEIVER_NAME, description="unique; routes name it")
    kind: Literal["alertmanager", "webhook"]
    url: str = Field(description="alertmanager: its base URL (http://am:9093); webhook: "
                     "the URL the JSON body is POSTed to")
    secret: SecretSource | None = Field(
        default=None, description="webhook: where the HMAC-SHA256 signing secret is read")
    timeout_s: float = Field(default=5.0, gt=0, le=120)
    max_attempts: int | None = Field(
        default=None, ge=1, le=10_000,
        description="tries per alert transition, the first included; unset: a receiver "
        "that is away (refused, timed out, 408, 429, 5xx) is tried until it answers, "
        "for up to give_up_after_s")
    give_up_after_s: float = Field(
        default=86_400.0, gt=0, le=7 * 86_400,
        description="a transition still undelivered this long after it happened is given "
        "up (its alert is stale by then)")
    backoff: Backoff = Backoff()

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"{url!r} is not an http(s) URL; write e.g. http://alertmanager:9093")
        return url.rstrip("/")

    @model_validator(mode="after")
    def _secret(self) -> Receiver:
        if self.kind == "webhook" and self.secret is None:
            raise ValueError(f"webhook {self.name!r} has no secret: add secret: {{env: NAME}} "
                             "or secret: {file: /path} (webhook bodies are always signed)")
        if self.kind == "alertmanager" and self.secret is not None:
            raise ValueError(f"alertmanager {self.name!r}: remove secret (Alertmanager's API "
                             "takes no signature)")
        return self


class Route(BaseModel):
    """Alerts whose labels match every matcher go to ``receivers``; routes are
    tried in order and the first that matches ends the search unless it says
    ``continue: true``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    matchers: list[str] = Field(default_factory=list, description=(
        "e.g. severity=critical, rule=~gpu_.*, workspace!=scratch; labels: alertname (the "
        "rule), rule, severity, node, job, workspace, gpu, subject; none: every alert"))
    receivers: list[str] = Field(min_length=1)
    continue_: bool = Field(default=False, alias="continue")

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, matchers: list[str]) -> list[str]:
        for text in matchers:
            parse_matcher(text)
        return matchers

    def parsed(self) -> tuple[Matcher, ...]:
        return tuple(parse_matcher(t) for t in self.matchers)


class DeliveryConfig(BaseModel):
    """The receivers file (PRIMUS_LENS_ALERT_RECEIVERS): where alerts go."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    receivers: list[Receiver] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list, description=(
        "tried in order; none: every alert goes to every receiver"))
    default_receivers: list[str] | None = Field(default=None, description=(
        "where an alert no route matches goes; unset: every receiver, []: nowhere"))
    dashboard_url: str | None = Field(default=None, description=(
        "the link of a job's alert (Alertmanager's generatorURL, the webhook's "
        "dashboard_url), e.g. https://grafana.example/d/primus-job?var-job={job}"))
    node_dashboard_url: str | None = Field(default=None, description=(
        "the link of a node's alert, e.g. https://grafana.example/d/primus-node?var-node={node}"))
    resend_interval_s: float = Field(default=60.0, ge=0.2, le=3600, description=(
        "open alerts are sent to Alertmanager again this often (it resolves an alert "
        "whose endsAt, 4 intervals ahead, passes)"))
    silence_refresh_s: float = Field(default=15.0, ge=0.1, le=3600, description=(
        "how long Alertmanager's silences are trusted before they are read again"))
    concurrency: int = Field(default=16, ge=1, le=1024,
                             description="deliveries in flight at once")

    @field_validator("dashboard_url", "node_dashboard_url")
    @classmethod
    def _template(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(url) if f is not None]
        except ValueError as exc:
            raise ValueError(f"{url!r}: {exc}; write placeholders as {{job}}") from None
        bad = [n for n in names if n not in LINK_FIELDS]
        if bad:
            raise ValueError(f"{url!r} names {', '.join(bad)}: use only "
                             f"{', '.join('{' + f + '}' for f in LINK_FIELDS)}")
        return url

    @model_validator(mode="after")
    def _names(self) -> DeliveryConfig:
        names = [r.name for r in self.receivers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"receivers: {', '.join(twice)} named twice; give each a "
                             "unique name")
        named = [(f"routes.{i}.receivers", n) for i, r in enumerate(self.routes)
                 for n in r.receivers]
        named += [("default_receivers", n) for n in self.default_receivers or []]
        for where, name in named:
            if name not in names:
                raise ValueError(f"{where} names {name!r}, which is not a receiver (known: "
                                 f"{', '.join(names) or 'none'}); add it under receivers or "
                                 "correct the name")
        return self

    def receiver(self, name: str) -> Receiver:
        return next(r for r in self.receivers if r.name == name)

    @property
    def alertmanagers(self) -> list[Receiver]:
        return [r for r in self.receivers if r.kind == "alertmanager"]


def read_secret(receiver: Receiver, *, env: dict[str, str] | None = None) -> bytes:
    """A webhook's signing secret; ValueError says why it cannot be read."""
    source = receiver.secret
    assert source is not None
    environ = os.environ if env is None else env
    if source.env is not None:
        value = environ.get(source.env, "")
        if not value:
            raise ValueError(f"the environment variable {source.env} is empty or not set: "
                             "set it to the webhook's shared secret")
        return value.encode()
    assert source.file is not None
    try:
        data = source.file.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {source.file} ({exc.strerror or exc}): mount the "
                         "Secret there or correct the path") from None
    if not data:
        raise ValueError(f"{source.file} is empty: put the webhook's shared secret in it")
    return data


def load_delivery(path: Path, *, env: dict[str, str] | None = None
                  ) -> tuple[DeliveryConfig, dict[str, bytes]]:
    """The receivers file and each webhook's secret; raises SpecError naming
    the file, the field and the fix."""
    config = load_model(path, DeliveryConfig)
    secrets: dict[str, bytes] = {}
    problems: list[str] = []
    for i, receiver in enumerate(config.receivers):
        if receiver.kind != "webhook":
            continue
        try:
            secrets[receiver.name] = read_secret(receiver, env=env)
        except ValueError as exc:
            which = "env" if receiver.secret and receiver.secret.env else "file"
            problems.append(f"field 'receivers.{i}.secret.{which}': {exc}")
    if problems:
        raise SpecError(path, problems)
    return config, secrets
