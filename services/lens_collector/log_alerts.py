"""Alerts on log lines (pure): rules as data, a state machine fed lines.

A rule is a pattern, a window, a count, a severity and a fault class:
``infra`` (a collective timeout, an RDMA error, a GPU hardware error: the
job is a victim and failover may recover it) or ``user`` (an out-of-memory
or a traceback at exit: retrying the same job will not help). A rule opens
an alert for its key (the job, or the node for node-scoped rules) when
``count`` matching lines arrive within ``window_s``, and closes it after
``clear_s`` without one; it opens once per episode, however many lines
follow. The alerts are the metric rules' ``Transition``s (``alerts.py``),
so the collector publishes both the same way, as ``lens.alert``.

The rules live in ``log_alerts.yaml`` beside this module (a file of the
same shape may add or replace rules by name); a malformed rule fails at
load with the file, the rule and the field. Time is the line's, given by
the caller; nothing here reads a clock.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from libs.specs import load_model
from services.lens_collector.alerts import Severity, Transition

BUILTIN = Path(__file__).with_name("log_alerts.yaml")
_MAX_MESSAGE = 300  # the line quoted in an alert's message, cut
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\\[1-9]|\(\?P=")


class LogRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="the alert's rule: log_<name>")
    pattern: str = Field(description="a regular expression searched in each line")
    ignore_case: bool = True
    window_s: float = Field(default=60.0, gt=0)
    count: int = Field(default=1, ge=1, description="matching lines within window_s to open")
    clear_s: float = Field(default=600.0, gt=0, description="quiet this long to close")
    severity: Severity = "warning"
    fault_class: Literal["infra", "user"] = Field(
        description="infra: the job is a victim (failover may recover it); user: the job's own")
    scope: Literal["job", "node"] = Field(
        default="job", description="node: about the node the line came from (GPU hardware)")
    description: str = ""

    @field_validator("pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value[:80]!r} is not a regular expression: {exc}") from None
        # The store selects candidate lines with RE2, which has no
        # look-around or back-references.
        unsupported = _NOT_RE2.search(value)
        if unsupported:
            raise ValueError(f"{value[:80]!r} uses {unsupported.group(0)!r}: look-around and "
                             "back-references are not supported (RE2 syntax)")
        return value


class LogRuleFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: list[LogRule] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> LogRuleFile:
        names = [r.name for r in self.rules]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rule names must be unique: {', '.join(twice)}")
        return self


def load_rules(*paths: Path) -> list[LogRule]:
    """The built-in rules, then each file's (same name: replaced)."""
    merged: dict[str, LogRule] = {}
    for path in (BUILTIN, *paths):
        merged.update({r.name: r for r in load_model(path, LogRuleFile).rules})
    return list(merged.values())


@dataclass(frozen=True)
class LogLine:
    at: float  # epoch seconds, the line's
    text: str
    job: str | None = None
    node: str | None = None
    rank: int | None = None


@dataclass
class _Episode:
    hits: deque[float] = field(default_factory=deque)
    opened_at: float | None = None
    last_hit: float = 0.0
    node: str | None = None
    job: str | None = None
    first_line: str = ""


class LogAlerts:
    """Feed lines (``observe``) and the time (``tick``); both return the
    alerts that opened or closed."""

    def __init__(self, rules: list[LogRule]) -> None:
        self.rules = rules
        flags = {True: re.IGNORECASE, False: 0}
        self._compiled = [(r, re.compile(r.pattern, flags[r.ignore_case])) for r in rules]
        self._episodes: dict[tuple[str, str], _Episode] = {}
        # One expression for the store to pick candidate lines with (RE2).
        self.any_pattern = "|".join(
            f"({'(?i)' if r.ignore_case else ''}{r.pattern})" for r in rules) or "$^"

    def fault_class(self, rule: str) -> str | None:
        """``infra`` or ``user`` for an alert's rule name (``log_<name>``)."""
        name = rule.removeprefix("log_")
        return next((r.fault_class for r in self.rules if r.name == name), None)

    def observe(self, line: LogLine) -> list[Transition]:
        out: list[Transition] = []
        for rule, pattern in self._compiled:
            if not pattern.search(line.text):
                continue
            key = line.node if rule.scope == "node" else line.job
            if not key:
                continue  # nothing to say it about
            ep = self._episodes.setdefault((rule.name, key), _Episode())
            ep.hits.append(line.at)
            while ep.hits and ep.hits[0] < line.at - rule.window_s:
                ep.hits.popleft()
            ep.last_hit = max(ep.last_hit, line.at)
            if ep.opened_at is None and len(ep.hits) >= rule.count:
                ep.opened_at, ep.node, ep.job = line.at, line.node, line.job
                ep.first_line = line.text.strip()[:_MAX_MESSAGE]
                where = f" (rank {line.rank} on {line.node})" if line.rank is not None else ""
                out.append(Transition(
                    rule=f"log_{rule.name}", state="open", key=key, opened_at=line.at,
                    at=line.at, node=line.node,
                    job=line.job if rule.scope == "job" else None,
                    value=float(len(ep.hits)), threshold=float(rule.count),
                    severity=rule.severity, fault_class=rule.fault_class,
                    message=f"{rule.fault_class}: {rule.description or rule.name}{where}: "
                            f"{ep.first_line}"))
        return out

    def tick(self, now: float) -> list[Transition]:
        """Close the alerts whose rule has been quiet for its ``clear_s``;
        forget quiet keys that never opened (memory stays bounded)."""
        out: list[Transition] = []
        by_name = {r.name: r for r in self.rules}
        for (name, key), ep in list(self._episodes.items()):
            rule = by_name[name]
            if now - ep.last_hit < max(rule.clear_s, rule.window_s):
                continue
            if ep.opened_at is not None:
                out.append(Transition(
                    rule=f"log_{name}", state="closed", key=key, opened_at=ep.opened_at,
                    at=now, node=ep.node, job=ep.job if rule.scope == "job" else None,
                    severity=rule.severity, fault_class=rule.fault_class,
                    message=f"no '{name}' line for {rule.clear_s:g} s"))
            del self._episodes[(name, key)]
        return out

    def open_alerts(self) -> list[tuple[str, str]]:
        return [(f"log_{n}", k) for (n, k), ep in self._episodes.items()
                if ep.opened_at is not None]
