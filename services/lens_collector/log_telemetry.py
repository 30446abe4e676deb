"""Workers' output lines as job telemetry (pure): the collector hands each
``log.worker`` batch here and stores the rows it returns in
``job_metrics`` with ``origin = 'log'``.

A job's format is its ``log_format`` (``auto`` unless the job said
otherwise, with its own ``log_formats`` added to the built-in ones). With
``auto`` the first lines are held until a format's detect patterns match
(then they are parsed too); a job whose first ``DETECT_GIVE_UP`` lines name
no framework is not parsed at all, so a job that prints no training log
costs one regex pass per line only while it starts.

Row ids follow the batch id and the line's index, so a redelivered batch
yields the same rows, which the store drops. A framework that prints no
iteration (Hugging Face's loss dicts) gets the one after the last seen.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from libs.log_formats import FormatFile, Parsed, Parser, builtin_parser

DETECT_GIVE_UP = 20_000  # lines of a job without a framework's line: not parsed
HELD_LINES = 2_000  # lines held per job while its format is unknown

# job_metrics columns the parsed rows fill, in this order.
COLUMNS = ["time", "job", "rank", "attempt", "node", "event_id", "iteration", "loss",
           "throughput", "step_time_s", "checkpoint_path", "grad_norm", "tokens_per_s",
           "origin", "learning_rate", "samples_per_s", "tflops", "skipped_iterations",
           "nan_iterations"]


@dataclass(frozen=True)
class JobFormat:
    """What a job asked for: ``log_format`` and its own ``log_formats``."""

    name: str = "auto"
    own: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Job:
    parser: Parser
    fmt: str | None  # None: not known yet (auto)
    held: deque[tuple[dict[str, Any], int]] = field(default_factory=deque)
    seen: int = 0
    last_iteration: dict[tuple[int, int], int] = field(default_factory=dict)
    progressed: set[int] = field(default_factory=set)  # attempts with a step read


class LogTelemetry:
    """Per job: its format, the lines held while detecting, the last
    iteration per (attempt, rank). ``format_of`` answers what a job asked
    for (the collector reads it from the job's ``job.submitted``)."""

    def __init__(self, format_of: Callable[[str], JobFormat | None]) -> None:
        self.format_of = format_of
        self.jobs: dict[str, _Job] = {}
        self.parsed = 0
        # (job, attempt, iteration) of each attempt's first step read: the
        # collector announces it (job.progress) for failover's timing.
        self.first_steps: list[tuple[str, int, int]] = []

    def wants(self, job: str) -> bool:
        """Whether a batch of ``job`` is worth decoding (its format is not
        ``none``, or not known yet)."""
        known = self.jobs.get(job) or self._start(job)
        return known.fmt != "none"

    def forget(self, job: str) -> None:
        self.jobs.pop(job, None)

    def rows(self, batch: dict[str, Any]) -> list[list[Any]]:
        """``job_metrics`` rows of one decoded ``log.worker`` message."""
        job_id = batch.get("job")
        if not isinstance(job_id, str):
            return []
        job = self.jobs.get(job_id) or self._start(job_id)
        if job.fmt == "none":
            return []
        lines = len(batch["data"]["text"])
        job.seen += lines
        if job.fmt is None:
            job.held.append((batch, 0))
            held = sum(len(b["data"]["text"]) - start for b, start in job.held)
            while held > HELD_LINES and len(job.held) > 1:
                old, start = job.held.popleft()
                held -= len(old["data"]["text"]) - start
            found = job.parser.detect(
                t for b, start in job.held for t in b["data"]["text"][start:])
            if found is None:
                if job.seen >= DETECT_GIVE_UP:
                    job.fmt, job.held = "none", deque()
                return []
            job.fmt = found
            out: list[list[Any]] = []
            for held_batch, start in job.held:
                out += self._parse(job, held_batch, start)
            job.held = deque()
            return out
        return self._parse(job, batch, 0)

    def _start(self, job_id: str) -> _Job:
        wanted = self.format_of(job_id) or JobFormat()
        parser = builtin_parser()
        if wanted.own:
            merged = {**builtin_parser().formats.formats, **wanted.own}
            parser = Parser(FormatFile.model_validate({"formats": merged}))
        fmt = None if wanted.name == "auto" else wanted.name
        if fmt is not None and fmt != "none" and fmt not in parser.names:
            fmt = None  # a format this collector does not know (yet): detect
        job = _Job(parser, fmt)
        self.jobs[job_id] = job
        return job

    def _parse(self, job: _Job, batch: dict[str, Any], start: int) -> list[list[Any]]:
        assert job.fmt is not None
        data = batch["data"]
        texts, streams, offsets = data["text"], data["stream"], data["t_ms"]
        attempt, rank = int(data["attempt"]), int(data["rank"])
        base: datetime | None = None
        out: list[list[Any]] = []
        for i in range(start, len(texts)):
            if streams[i] == "meta":
                continue
            parsed = job.parser.parse(texts[i], job.fmt, i)
            if parsed is None:
                continue
            if base is None:
                base = _time(batch["time"])
            out.append(self._row(job, batch, attempt, rank, parsed,
                                 base + timedelta(milliseconds=offsets[i]), i))
        self.parsed += len(out)
        return out

    def _row(self, job: _Job, batch: dict[str, Any], attempt: int, rank: int,
             parsed: Parsed, at: datetime, index: int) -> list[Any]:
        key = (attempt, rank)
        iteration = parsed.iteration
        if iteration is None:
            iteration = job.last_iteration.get(key, 0) + (parsed.kind == "progress")
        job.last_iteration[key] = iteration
        if parsed.kind == "progress" and attempt not in job.progressed:
            job.progressed.add(attempt)
            self.first_steps.append((batch["job"], attempt, iteration))
        v = parsed.values
        checkpoint = (parsed.path or f"iteration {iteration}") \
            if parsed.kind == "checkpoint" else None
        return [at.replace(tzinfo=None), batch["job"], rank, attempt, batch.get("node") or "",
                f"{batch['id']}.{index}", iteration, v.get("loss"), v.get("samples_per_s"),
                v.get("step_time_s"), checkpoint, _finite(v.get("grad_norm")),
                _finite(v.get("tokens_per_s")), "log", _finite(v.get("learning_rate")),
                _finite(v.get("samples_per_s")), _finite(v.get("tflops")),
                _count(v.get("skipped_iterations")), _count(v.get("nan_iterations"))]


def _time(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _count(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) and value >= 0 else None
