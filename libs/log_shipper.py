"""A worker's output lines, batched for Lens: cut, rate-limited, numbered.

The local driver's supervisor (``local_worker``) feeds it the bytes its
worker writes to stdout and stderr; on Kubernetes the node's agent feeds it
the lines of the pods' container logs. Both give the same ``WorkerLog``
batches, so Lens stores and parses a worker's output one way.

Decisions are made per chunk of bytes, not per line: a worker printing
100 MB/s of short lines would otherwise cost a Python call per line, and
the worker must never wait for its reader (a full pipe stops it). A chunk
the rate limit has no room for is dropped whole and counted; the next
batch after drops opens with a ``meta`` line saying how many lines and
bytes were lost, so the gap is visible where the lines are read.

Nothing here touches the bus or a file: ``Batcher`` is given the time and
returns the batches to send (``Shipper`` in ``local_worker`` sends them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from libs.events import LogStream, WorkerLog, WorkerLogData

CUT_MARK = " [primus-safe: line cut, {n} more bytes]"
# Characters JSON writes as \u00XX (6 bytes for one): binary output in a
# line must not push a batch past NATS's 1 MiB message limit.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class LogLimits(BaseModel):
    """How much of a job's output Lens takes (Settings ``worker_log_*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ship: bool = Field(default=True, description="send workers' output to Lens")
    rate_bytes_s: int = Field(default=8 << 20, gt=0, description="per job, shared by its "
                              "workers evenly (at least min_rate_bytes_s each)")
    min_rate_bytes_s: int = Field(default=256 << 10, gt=0, description="per worker, however "
                                  "many workers the job has")
    burst_s: float = Field(default=5.0, gt=0, description="a worker may print this many "
                           "seconds of its rate at once (start-up banners, tracebacks)")
    max_line_bytes: int = Field(default=16384, ge=256, description="longer lines are cut, "
                                "with a marker saying how much")
    batch_lines: int = Field(default=2000, ge=1)
    batch_bytes: int = Field(default=256 << 10, ge=4096, description="well under NATS's "
                             "1 MiB message limit")
    flush_s: float = Field(default=0.5, gt=0, description="a batch waits at most this long")
    file_max_bytes: int = Field(default=100 << 20, ge=4096, description="local driver: a "
                                "rank's log file is rotated at this size")
    file_keep: int = Field(default=3, ge=0, description="local driver: rotated files kept")

    def worker_rate(self, workers: int) -> float:
        return max(self.rate_bytes_s / max(workers, 1), float(self.min_rate_bytes_s))


@dataclass
class RateLimit:
    """A token bucket over bytes: ``rate`` per second, ``burst`` at most."""

    rate: float
    burst: float
    tokens: float = -1.0
    last: float | None = None

    def allow(self, size: int, now: float) -> bool:
        if self.last is None:
            self.tokens, self.last = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if size > self.tokens:
            return False
        self.tokens -= size
        return True


def text_of(raw: bytes, max_bytes: int) -> str:
    """A line as stored: bytes that are not UTF-8 escaped (``\\xNN``), the
    newline gone, and cut at ``max_bytes`` with a marker saying how much."""
    raw = raw.rstrip(b"\r\n")
    if len(raw) <= max_bytes:
        return raw.decode("utf-8", errors="backslashreplace")
    head = raw[:max_bytes].decode("utf-8", errors="ignore")  # not half a character
    return head + CUT_MARK.format(n=len(raw) - len(head.encode()))


@dataclass
class _Line:
    text: str
    stream: LogStream
    time: float


@dataclass
class Batcher:
    """Lines of one worker (job, attempt, rank) into ``WorkerLog`` batches.

    ``feed`` takes the complete lines of a chunk; ``take`` returns the
    batches due (full, or older than ``flush_s``). Lines are numbered from
    ``seq`` on: the batch id is ``<job>-a<attempt>-r<rank>-l<seq>``, so a
    batch sent twice is stored once."""

    job: str
    attempt: int
    rank: int
    node: str | None
    limits: LogLimits
    rate: RateLimit
    source: str = "worker-log"
    seq: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    total_dropped_lines: int = 0
    cut_lines: int = 0
    _pending: list[_Line] = field(default_factory=list)
    _pending_bytes: int = 0
    _report_lines: int = 0  # drops the next batch's meta line tells
    _report_bytes: int = 0

    @classmethod
    def for_worker(cls, job: str, attempt: int, rank: int, node: str | None, workers: int,
                   limits: LogLimits, *, source: str = "worker-log") -> Batcher:
        rate = limits.worker_rate(workers)
        return cls(job, attempt, rank, node, limits, RateLimit(rate, rate * limits.burst_s),
                   source=source)

    def feed(self, lines: list[bytes], stream: LogStream, now: float) -> list[WorkerLog]:
        """Complete lines (each may end with its newline) that arrived at ``now``."""
        size = sum(len(raw) for raw in lines)
        if not self.rate.allow(size, now):
            self.drop(len(lines), size)
            return self.take(now)
        out: list[WorkerLog] = []
        if self.dropped_lines:
            out += self._close_batch()  # the meta line opens a batch of its own
            self._report_lines, self._report_bytes = self.dropped_lines, self.dropped_bytes
            self._add(_Line(
                f"primus-safe: {self.dropped_lines} line(s), {self.dropped_bytes} bytes of "
                f"output dropped: over this worker's log rate of {self.rate.rate:.0f} bytes/s",
                "meta", now))
            self.dropped_lines = self.dropped_bytes = 0
        limit = self.limits.max_line_bytes
        for raw in lines:
            if len(raw) > limit:
                self.cut_lines += 1
            self._add(_Line(text_of(raw, limit), stream, now))
            if (len(self._pending) >= self.limits.batch_lines
                    or self._pending_bytes >= self.limits.batch_bytes):
                out += self._close_batch()
        return out + self.take(now)

    def drop(self, lines: int, size: int) -> None:
        """Count lines the rate has no room for (the next batch's meta line
        tells them); a reader that asked the rate itself (the node agent
        skips parsing what would be dropped) reports them here."""
        self.dropped_lines += lines
        self.dropped_bytes += size
        self.total_dropped_lines += lines

    def take(self, now: float, *, flush: bool = False) -> list[WorkerLog]:
        """The batch due at ``now`` (or any pending one, with ``flush``)."""
        out: list[WorkerLog] = []
        if self._pending and (flush or now - self._pending[0].time >= self.limits.flush_s):
            out = self._close_batch()
        if flush and self.dropped_lines:  # drops at the very end: still told
            out += self.feed([], "stdout", now) + self._close_batch()
        return out

    def _add(self, line: _Line) -> None:
        self._pending.append(line)
        size = len(line.text) + 16
        if not line.text.isprintable():  # tabs, colours, binary: as JSON escapes them
            size += 5 * len(_CONTROL.findall(line.text))
        self._pending_bytes += size

    def _close_batch(self) -> list[WorkerLog]:
        if not self._pending:
            return []
        lines, self._pending, self._pending_bytes = self._pending, [], 0
        t0 = lines[0].time
        event = WorkerLog(
            id=f"{self.job}-a{self.attempt}-r{self.rank}-l{self.seq}",
            time=datetime.fromtimestamp(t0, UTC), source=self.source, job=self.job,
            node=self.node,
            data=WorkerLogData(
                attempt=self.attempt, rank=self.rank, seq=self.seq,
                text=[x.text for x in lines], stream=[x.stream for x in lines],
                t_ms=[max(0, round((x.time - t0) * 1000)) for x in lines],
                dropped_lines=self._report_lines, dropped_bytes=self._report_bytes))
        self._report_lines = self._report_bytes = 0
        self.seq += len(lines)
        return [event]


@dataclass
class LineSplitter:
    """Bytes of one stream into complete lines; a line longer than
    ``max_bytes`` is let out cut (the rest of it up to its newline is
    skipped), so a worker printing without newlines cannot grow memory."""

    max_bytes: int
    _rest: bytes = b""
    _skipping: int = 0  # bytes of a cut line still to skip

    def split(self, chunk: bytes) -> list[bytes]:
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                self._skipping += len(chunk)
                return []
            chunk = chunk[end + 1:]
            self._skipping = 0
        data = self._rest + chunk if self._rest else chunk
        lines = data.split(b"\n")
        self._rest = lines.pop()
        if len(self._rest) > self.max_bytes:
            # Cut now; the marker counts what arrived so far of the line.
            lines.append(self._rest)
            self._skipping, self._rest = 1, b""
        return lines

    def end(self) -> list[bytes]:
        """What is left when the stream closes (a last line without newline)."""
        rest, self._rest = self._rest, b""
        return [rest] if rest else []
