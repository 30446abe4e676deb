"""When each periodic health probe runs and when its failures are reported
(pure: the caller passes the time in, nothing here sleeps, reads a clock or
runs a probe).

A check is due ``interval_s`` after its previous start; its first start is
spread over ``[0, jitter_s)`` so a thousand agents restarted together do not
probe in lockstep (the offset is a hash of the seed, usually the node name,
and the check name: the same on every restart). A check still running when
it is due again is skipped (``skip_if_running``) or started a second time.
A run that outlives ``timeout_s`` counts as a failure at once. A failure is
reported only after ``failures_before_report`` consecutive failures, once per
streak; the first success after a reported streak is reported as recovery.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from services.bench.config import CheckConfig

Status = Literal["ok", "failed", "unavailable"]


@dataclass(frozen=True)
class Start:
    name: str
    run: int  # the check's run number, to match the finish to this start


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


@dataclass(frozen=True)
class Report:
    """A failing streak reached its threshold, or a reported streak ended."""

    name: str
    failed: bool
    consecutive: int
    detail: str


@dataclass
class CheckState:
    spec: CheckConfig
    next_due: float
    runs: int = 0
    running: dict[int, float] = field(default_factory=dict)  # run -> started at
    timed_out: set[int] = field(default_factory=set)
    consecutive_failures: int = 0
    reported: bool = False
    last_status: Status | None = None
    last_detail: str = ""
    skipped: int = 0


def start_offset(seed: str, name: str, jitter_s: float) -> float:
    """A stable pseudo-random offset in [0, jitter_s)."""
    if jitter_s <= 0:
        return 0.0
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * jitter_s


class ProbeSchedule:
    def __init__(self, checks: list[CheckConfig], *, now: float, seed: str = "") -> None:
        self.seed = seed
        self.states: dict[str, CheckState] = {}
        self.reconfigure(checks, now=now)

    def reconfigure(self, checks: list[CheckConfig], *, now: float) -> None:
        """Take a new list of checks: unchanged ones keep their state and timing,
        changed ones keep their failure count, new ones start after their jitter."""
        states: dict[str, CheckState] = {}
        for spec in checks:
            old = self.states.get(spec.name)
            if old is None:
                states[spec.name] = CheckState(
                    spec, next_due=now + start_offset(self.seed, spec.name, spec.jitter_s))
                continue
            if old.spec != spec:
                if old.runs:  # due one new interval after its last start
                    last_start = old.next_due - old.spec.interval_s
                    old.next_due = max(now, last_start + spec.interval_s)
                old.spec = spec
            states[spec.name] = old
        self.states = states

    def due(self, now: float) -> list[Start | Skip | Report]:
        """What to do now: each due check either starts or is skipped until its
        next interval. A start is recorded here; report its end with ``finished``.
        A skip over a run that already timed out counts as another failure (a
        hung probe must not hide behind skip-if-running)."""
        actions: list[Start | Skip | Report] = []
        for name in sorted(self.states):
            state = self.states[name]
            if now < state.next_due:
                continue
            state.next_due += state.spec.interval_s
            if state.next_due <= now:  # woke late (a long bench): no burst of catch-ups
                state.next_due = now + state.spec.interval_s
            if state.running and state.spec.skip_if_running:
                state.skipped += 1
                since = min(state.running.values())
                actions.append(Skip(name, f"still running since {now - since:.1f} s"))
                if state.timed_out:
                    report = self._record(state, "failed",
                                          f"hung: still running {now - since:.0f} s after start")
                    if report is not None:
                        actions.append(report)
                continue
            state.runs += 1
            state.running[state.runs] = now
            actions.append(Start(name, state.runs))
        return actions

    def expire(self, now: float) -> list[Report]:
        """Runs past their timeout fail now (the run may still finish later)."""
        reports = []
        for name in sorted(self.states):
            state = self.states[name]
            for run, started in sorted(state.running.items()):
                if run not in state.timed_out and now - started >= state.spec.timeout_s:
                    state.timed_out.add(run)
                    report = self._record(state, "failed",
                                          f"timed out after {state.spec.timeout_s:g} s")
                    if report is not None:
                        reports.append(report)
        return reports

    def finished(self, name: str, run: int, status: Status, detail: str = "") -> Report | None:
        """A run ended. A run that already timed out only frees its slot."""
        state = self.states.get(name)
        if state is None:  # removed from the configuration while running
            return None
        state.running.pop(run, None)
        if run in state.timed_out:
            state.timed_out.discard(run)
            return None
        return self._record(state, status, detail)

    def unreport(self, name: str) -> None:
        """The failure report of ``name``'s streak did not go out: the next
        failure of the streak reports it again (a streak is said once, so a
        lost report would otherwise never be said)."""
        state = self.states.get(name)
        if state is not None:
            state.reported = False

    def next_wake(self, now: float) -> float:
        """The earliest time anything can happen (a check due or a timeout)."""
        times = [s.next_due for s in self.states.values()]
        times += [started + s.spec.timeout_s for s in self.states.values()
                  for run, started in s.running.items() if run not in s.timed_out]
        return max(now, min(times)) if times else now + 3600.0

    @staticmethod
    def _record(state: CheckState, status: Status, detail: str) -> Report | None:
        state.last_status, state.last_detail = status, detail
        name, threshold = state.spec.name, state.spec.failures_before_report
        if status == "failed":
            state.consecutive_failures += 1
            if state.consecutive_failures >= threshold and not state.reported:
                state.reported = True
                return Report(name, True, state.consecutive_failures, detail)
            return None
        # ok, or unavailable (a missing tool is not a failing GPU): the streak ends.
        count, was_reported = state.consecutive_failures, state.reported
        state.consecutive_failures, state.reported = 0, False
        if was_reported:
            return Report(name, False, count, detail or status)
        return None

    def snapshot(self) -> dict[str, dict[str, object]]:
        return {name: {"kind": s.spec.kind, "last": s.last_status, "detail": s.last_detail,
                       "consecutive_failures": s.consecutive_failures, "reported": s.reported,
                       "runs": s.runs, "skipped": s.skipped, "running": len(s.running)}
                for name, s in sorted(self.states.items())}
