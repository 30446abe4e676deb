"""Lens alert rules (pure): a state machine fed readings with timestamps.

No I/O and no clock: the shell (``alerting``) asks ClickHouse what each GPU,
job and node did in the last window and feeds it here with the window's end
time; ``tick`` applies the rules about silence (a job that stopped
iterating, a checkpoint that got old, a node that stopped reporting). Every
rule opens an alert once and closes it once, as ``Transition``s, and the
thresholds and durations come from ``AlertConfig``.

Job rules follow the job's life as the scheduler tells it (``job_states``):
a placed job is watched from its placement (so one that never reports is
hung from then), and a job that completed, failed or was preempted is not
watched until it is placed again; its open alerts close. A new placement
starts the job's progress over (it resumes from a checkpoint, below the
iteration it had reached).

Threshold rules have a duration and hysteresis: a reading must stay above
``above`` for ``for_s`` to open, and below ``clear_below`` for
``clear_for_s`` to close, so a value hovering at the line does not flap.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Severity = Literal["info", "warning", "critical"]


class ThresholdRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    above: float
    for_s: float = Field(default=0.0, ge=0)
    clear_below: float
    clear_for_s: float = Field(default=0.0, ge=0)
    severity: Severity = "warning"


class AlertConfig(BaseModel):
    """Every rule's thresholds (a YAML file can override any of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_temp_sensor: Literal["temp_c", "temp_junction_c", "temp_hbm_c"] = "temp_c"
    gpu_temp_c: ThresholdRule = ThresholdRule(above=80, for_s=600, clear_below=75, clear_for_s=60)
    gpu_vram_frac: ThresholdRule = ThresholdRule(above=0.95, for_s=60, clear_below=0.9,
                                                 clear_for_s=30)
    gpu_power_frac: ThresholdRule = ThresholdRule(above=0.95, for_s=60, clear_below=0.9,
                                                  clear_for_s=30)
    job_hang_s: float = Field(default=300, gt=0, description="no new iteration for this long")
    throughput_ratio: float = Field(default=0.8, gt=0, lt=1)
    throughput_clear_ratio: float = Field(default=0.9, gt=0, le=1)
    throughput_for_s: float = Field(default=60, ge=0)
    throughput_clear_for_s: float = Field(default=30, ge=0)
    throughput_history: int = Field(default=60, ge=3, description="windows in the median")
    throughput_min_history: int = Field(default=6, ge=1)
    checkpoint_max_age_s: float = Field(default=3600, gt=0)
    node_down_s: float = Field(default=60, gt=0)

    def open_levels(self) -> tuple[float, float, float]:
        """GPU readings above which an alert may start (temp, vram, power)."""
        return self.gpu_temp_c.above, self.gpu_vram_frac.above, self.gpu_power_frac.above


@dataclass(frozen=True)
class Transition:
    rule: str
    state: Literal["open", "closed"]
    key: str  # what it is about: node, node/gpuN or job
    opened_at: float  # epoch seconds
    at: float
    node: str | None = None
    job: str | None = None
    gpu: int | None = None
    value: float | None = None
    threshold: float | None = None
    severity: Severity = "warning"
    message: str = ""
    fault_class: Literal["infra", "user"] | None = None  # log rules only

    @property
    def alert_id(self) -> str:
        """The same for an alert's open and close, and for any evaluator."""
        raw = f"{self.rule}|{self.key}|{self.opened_at:.3f}".encode()
        return hashlib.sha256(raw).hexdigest()[:20]


@dataclass(frozen=True)
class GpuReading:
    """A GPU's highest readings in one window (None: not reported)."""

    temp_c: float | None = None
    vram_frac: float | None = None
    power_frac: float | None = None


@dataclass(frozen=True)
class JobReading:
    """A job in one window, over all ranks."""

    iteration: int | None = None
    nonfinite_losses: int = 0
    finite_losses: int = 0
    throughput: float | None = None
    last_checkpoint: float | None = None  # epoch seconds of its newest checkpoint


@dataclass
class _Machine:
    """One threshold rule on one key: ok -> pending -> open -> clearing -> ok."""

    phase: Literal["ok", "pending", "open", "clearing"] = "ok"
    since: float = 0.0
    opened_at: float = 0.0
    baseline: float | None = None  # throughput: the median when it started


# Lifecycle events that end a job's watch, until it is placed again.
ENDED_TYPES = ("job.completed", "job.failed", "job.preempted")
PLACED_TYPE = "job.placed"
ENDED_KEPT_S = 86_400.0  # how long an ended job's late telemetry is still ignored


@dataclass
class _Job:
    first_seen: float
    placed_at: float | None = None
    iteration: int = -1
    progressed_at: float = 0.0
    last_checkpoint: float | None = None
    history: deque[float] = field(default_factory=deque)


class AlertEngine:
    def __init__(self, config: AlertConfig | None = None) -> None:
        self.config = config or AlertConfig()
        self._machines: dict[tuple[str, str], _Machine] = {}  # (rule, key)
        self._meta: dict[tuple[str, str], dict[str, object]] = {}
        self._jobs: dict[str, _Job] = {}
        self._ended: dict[str, float] = {}  # job -> when its watch ended
        self._nodes: dict[str, float] = {}

    # ------------------------------------------------------------------ feeding

    def gpu_window(self, at: float, readings: dict[tuple[str, int], GpuReading]
                   ) -> list[Transition]:
        """Readings of the GPUs that mattered in the window ending at ``at``: those
        above an alert level, and those the rules watch (``watched_gpu_keys``)
        that reported at all. A GPU left out was below every alert level (or
        silent), so an unfinished breach of it starts over."""
        out: list[Transition] = []
        c = self.config
        for rule, attr, threshold in (("gpu_temp_high", "temp_c", c.gpu_temp_c),
                                      ("gpu_vram_high", "vram_frac", c.gpu_vram_frac),
                                      ("gpu_power_high", "power_frac", c.gpu_power_frac)):
            seen: set[str] = set()
            for (node, gpu), reading in readings.items():
                value = getattr(reading, attr)
                if value is None or math.isnan(value):
                    continue
                key = f"{node}/gpu{gpu}"
                seen.add(key)
                out += self._threshold(rule, key, value, at, threshold,
                                       node=node, gpu=gpu)
            for (r, key), m in self._machines.items():
                if r == rule and key not in seen and m.phase == "pending":
                    m.phase = "ok"  # the breach did not last
        return out

    def job_window(self, at: float, jobs: dict[str, JobReading]) -> list[Transition]:
        out: list[Transition] = []
        for name, r in jobs.items():
            if name in self._ended:  # its last rows, stored after it ended
                continue
            job = self._jobs.setdefault(name, _Job(first_seen=at, progressed_at=at))
            if r.iteration is not None and r.iteration > job.iteration:
                if self._is_open("job_hang", name):
                    out.append(self._close("job_hang", name, at, value=float(r.iteration)))
                job.iteration, job.progressed_at = r.iteration, at
            if r.last_checkpoint is not None and (job.last_checkpoint is None
                                                  or r.last_checkpoint > job.last_checkpoint):
                job.last_checkpoint = r.last_checkpoint
                if self._is_open("checkpoint_stale", name):
                    out.append(self._close("checkpoint_stale", name, at))
            if r.nonfinite_losses and not self._is_open("loss_nonfinite", name):
                out.append(self._open("loss_nonfinite", name, at, job=name, severity="critical",
                                      value=float(r.nonfinite_losses),
                                      message=f"{r.nonfinite_losses} NaN/inf loss value(s)"))
            elif r.finite_losses and not r.nonfinite_losses and self._is_open(
                    "loss_nonfinite", name):
                out.append(self._close("loss_nonfinite", name, at))
            if r.throughput is not None:
                out += self._throughput(name, job, r.throughput, at)
        return out

    def job_states(self, at: float, states: dict[str, tuple[str, float]]) -> list[Transition]:
        """Each job's latest lifecycle event (type, when) as the scheduler
        published it. Applying the same state twice changes nothing."""
        out: list[Transition] = []
        for name, (kind, when) in sorted(states.items()):
            when = min(when, at)  # a clock ahead of ours must not date the watch in the future
            if kind in ENDED_TYPES:
                if self._ended.get(name, float("-inf")) < when:
                    out += self.job_ended(name, at, when=when)
            elif kind == PLACED_TYPE:
                if self._ended.get(name, float("-inf")) >= when:
                    continue  # placed, then ended: the end is newer
                job = self._jobs.get(name)
                if job is None or job.placed_at is None or job.placed_at < when:
                    self._ended.pop(name, None)
                    old = self._jobs.get(name)
                    self._jobs[name] = _Job(first_seen=when, placed_at=when, progressed_at=when,
                                            last_checkpoint=old.last_checkpoint if old else None)
                    hang = self._machines.get(("job_hang", name))
                    if self._is_open("job_hang", name) and hang and hang.opened_at < when:
                        out.append(self._close("job_hang", name, at))  # a new attempt
        return out

    def learn_job(self, name: str, r: JobReading, last_report: float) -> None:
        """What a job did before a restart, taken in without any transition:
        an alert restored open stays open until a new reading says otherwise."""
        if name in self._ended:
            return
        job = self._jobs.setdefault(name, _Job(first_seen=last_report, progressed_at=last_report))
        if r.iteration is not None and r.iteration > job.iteration:
            job.iteration, job.progressed_at = r.iteration, max(job.progressed_at, last_report)
        if r.last_checkpoint is not None and (job.last_checkpoint is None
                                              or r.last_checkpoint > job.last_checkpoint):
            job.last_checkpoint = r.last_checkpoint

    def node_window(self, at: float, last_seen: dict[str, float]) -> list[Transition]:
        out: list[Transition] = []
        for node, seen in last_seen.items():
            if seen > self._nodes.get(node, float("-inf")):
                self._nodes[node] = seen
                if self._is_open("node_down", node):
                    out.append(self._close("node_down", node, at))
        return out

    def tick(self, now: float) -> list[Transition]:
        """The rules about silence, evaluated at ``now``."""
        c = self.config
        out: list[Transition] = []
        for node, seen in self._nodes.items():
            if now - seen > c.node_down_s and not self._is_open("node_down", node):
                out.append(self._open("node_down", node, now, node=node, severity="critical",
                                      value=round(now - seen, 3), threshold=c.node_down_s,
                                      message=f"no telemetry for {now - seen:.0f} s"))
        for name, job in self._jobs.items():
            quiet = now - job.progressed_at
            if quiet > c.job_hang_s and not self._is_open("job_hang", name):
                out.append(self._open("job_hang", name, now, job=name, severity="critical",
                                      value=round(quiet, 3), threshold=c.job_hang_s,
                                      message=f"no new iteration for {quiet:.0f} s "
                                              f"(last {job.iteration})"))
            age = now - (job.last_checkpoint or job.first_seen)
            if age > c.checkpoint_max_age_s and not self._is_open("checkpoint_stale", name):
                out.append(self._open("checkpoint_stale", name, now, job=name,
                                      value=round(age, 3), threshold=c.checkpoint_max_age_s,
                                      message=f"newest checkpoint is {age:.0f} s old"
                                      if job.last_checkpoint else
                                      f"no checkpoint in {age:.0f} s"))
        return out

    def job_ended(self, name: str, at: float, *, when: float | None = None) -> list[Transition]:
        """A job completed, failed or was preempted (``when``; default ``at``):
        close its alerts and stop watching it until it is placed again."""
        self._jobs.pop(name, None)
        self._ended[name] = at if when is None else when
        for old in [j for j, t in self._ended.items() if t < at - ENDED_KEPT_S]:
            del self._ended[old]
        out = [self._close(rule, key, at) for (rule, key), m in list(self._machines.items())
               if key == name and m.phase in ("open", "clearing")]
        for rule_key in [k for k in self._machines if k[1] == name]:
            del self._machines[rule_key]
        return out

    def restore(self, alerts: list[Transition], at: float) -> list[Transition]:
        """Alerts found open in the store after a restart stay open (no
        reopen). Should the store hold more than one open alert for the same
        rule and key (from before this rule), the oldest stays and the
        others are closed: one alert per condition."""
        out: list[Transition] = []
        for t in sorted(alerts, key=lambda t: (t.opened_at, t.alert_id)):
            if (t.rule, t.key) in self._machines:
                out.append(replace(t, state="closed", at=at,
                                   message=f"cleared: a duplicate of an older alert ({t.message})"))
                continue
            self._machines[(t.rule, t.key)] = _Machine("open", t.opened_at, t.opened_at)
            self._meta[(t.rule, t.key)] = _meta_of(t)
        return out

    def open_alerts(self) -> list[tuple[str, str]]:
        return sorted(k for k, m in self._machines.items() if m.phase in ("open", "clearing"))

    def watched_gpu_keys(self) -> list[str]:
        """GPUs with a breach under way or an alert open: their readings matter
        even below the alert level (to end the breach, or to close)."""
        return sorted({k for (r, k), m in self._machines.items()
                       if r.startswith("gpu_") and m.phase != "ok"})

    # ------------------------------------------------------------------ machinery

    def _threshold(self, rule: str, key: str, value: float, at: float, t: ThresholdRule,
                   **meta: object) -> list[Transition]:
        m = self._machines.setdefault((rule, key), _Machine())
        if m.phase in ("ok", "pending"):
            if value <= t.above:
                m.phase = "ok"
                return []
            if m.phase == "ok":
                m.phase, m.since = "pending", at
            if at - m.since >= t.for_s:
                return [self._open(rule, key, at, value=value, threshold=t.above,
                                   severity=t.severity, message=_says(rule, value, t.above),
                                   **meta)]
            return []
        if value >= t.clear_below:
            m.phase = "open"
            return []
        if m.phase == "open":
            m.phase, m.since = "clearing", at
        if at - m.since >= t.clear_for_s:
            return [self._close(rule, key, at, value=value)]
        return []

    def _throughput(self, name: str, job: _Job, value: float, at: float) -> list[Transition]:
        """Below ``throughput_ratio`` x the job's own trailing median for a while.
        The median is taken when the drop starts and the history stops
        learning until the job recovers, so a collapse does not become normal."""
        c = self.config
        m = self._machines.setdefault(("throughput_low", name), _Machine())
        out: list[Transition] = []
        if m.phase == "ok" and len(job.history) >= c.throughput_min_history:
            median = statistics.median(job.history)
            if value < c.throughput_ratio * median:
                m.phase, m.since, m.baseline = "pending", at, median
        if m.phase == "pending":
            assert m.baseline is not None
            limit = c.throughput_ratio * m.baseline
            if value >= limit:
                m.phase, m.baseline = "ok", None
            elif at - m.since >= c.throughput_for_s:
                out.append(self._open(
                    "throughput_low", name, at, job=name, value=value, threshold=limit,
                    message=f"throughput {value:.4g} below {c.throughput_ratio:g} x its "
                            f"median {m.baseline:.4g}"))
        elif m.phase in ("open", "clearing"):
            baseline = m.baseline or 0.0
            if value < c.throughput_clear_ratio * baseline:
                m.phase = "open"
            elif m.phase == "open":
                m.phase, m.since = "clearing", at
            if m.phase == "clearing" and at - m.since >= c.throughput_clear_for_s:
                out.append(self._close("throughput_low", name, at, value=value))
        if m.phase == "ok":
            job.history.append(value)
            while len(job.history) > c.throughput_history:
                job.history.popleft()
        return out

    def _is_open(self, rule: str, key: str) -> bool:
        m = self._machines.get((rule, key))
        return m is not None and m.phase in ("open", "clearing")

    def _open(self, rule: str, key: str, at: float, **meta: object) -> Transition:
        m = self._machines.setdefault((rule, key), _Machine())
        m.phase, m.opened_at = "open", at
        self._meta[(rule, key)] = meta
        return Transition(rule=rule, state="open", key=key, opened_at=at, at=at,
                          **meta)  # type: ignore[arg-type]

    def _close(self, rule: str, key: str, at: float, value: float | None = None
               ) -> Transition:
        m = self._machines.setdefault((rule, key), _Machine())
        meta = dict(self._meta.pop((rule, key), {}))
        meta["value"] = value
        meta["message"] = f"cleared: {meta.get('message', rule)}"
        opened_at = m.opened_at
        m.phase, m.baseline = "ok", None
        return Transition(rule=rule, state="closed", key=key, opened_at=opened_at, at=at,
                          **meta)  # type: ignore[arg-type]


def _says(rule: str, value: float, above: float) -> str:
    if rule == "gpu_temp_high":
        return f"{value:.1f} °C above {above:g} °C"
    return f"{rule.split('_')[1]} at {value:.1%} of the limit (alert above {above:.0%})"


def _meta_of(t: Transition) -> dict[str, object]:
    return {"node": t.node, "job": t.job, "gpu": t.gpu, "value": t.value,
            "threshold": t.threshold, "severity": t.severity, "message": t.message}
