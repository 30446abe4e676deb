"""One worker pod's container logs, read from the kubelet's files into
``WorkerLog`` batches, with the position to resume from (file I/O only: the
bench agent's ``pod_logs`` finds the pods, keeps the positions and sends).

The kubelet keeps a container's output in
``<pod dir>/<container>/<restartCount>.log``. It rotates ``0.log`` by
renaming it ``0.log.<YYYYmmdd-HHMMSS>`` (left uncompressed until the next
rotation, "so that container can still write and fluentd can finish
reading": pkg/kubelet/logs/container_log_manager.go) and the runtime opens
a new ``0.log``; a restarted container writes ``1.log``. The reader keeps
the file it reads open, so a rotated or deleted file is still read to its
end, and notices a rotation by the live name's inode changing.

A round ends on a batch boundary (the last batch is flushed), so a
``Cursor`` taken after a round says everything about where the next one
starts: the file (by inode) and offset, the next line number, the lines a
``P`` record left open and the worker's rate bucket. Its rate limit runs on
the records' own times, so reading the same bytes again from the same
cursor makes the same batches.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from libs.drivers.k8s_manifests import CONTAINER
from libs.events import WorkerLog
from libs.log_shipper import Batcher, LogLimits, RateLimit
from libs.logs import get_logger
from services.bench.cri_log import Joiner, Stream, Unfinished, parse_cri

READ_BYTES = 256 << 10
HEAD_BYTES = 64  # a record's time alone is 30 of them
TAIL_RECORDS = 16  # of a dropped chunk, looked at for a line left open
ROUND_BYTES = 64 << 20  # one worker's share of a round: no pod starves the others
GROUP_S = 0.01  # records further apart than this are fed (rate-checked) apart
_LOG_NAME = re.compile(r"^(0|[1-9][0-9]*)\.log$")
_ROTATED = re.compile(r"^(0|[1-9][0-9]*)\.log\.[0-9]{8}-[0-9]{6}$")  # not the .gz ones


class OpenLine(BaseModel):
    model_config = ConfigDict(extra="ignore")
    raw: str  # base64
    skipping: bool = False


class Cursor(BaseModel):
    """Where one worker's output was read to, with what goes with that point."""

    model_config = ConfigDict(extra="ignore")
    restart: int = 0  # which <n>.log
    file: str = ""  # its name, or the rotated name it was read under
    inode: int = 0  # the file being read (a rotated one keeps its inode)
    head: str = ""  # its first bytes (base64): a freed inode is reused by a newer file
    offset: int = 0
    seq: int = 0  # the worker's next line number
    clock: float = 0.0  # the newest record time read (the rate limit's clock)
    tokens: float | None = None
    rate_last: float | None = None
    open: dict[Stream, OpenLine] = {}


class Position(BaseModel):
    """One worker pod's entry in the positions file."""

    model_config = ConfigDict(extra="ignore")
    job: str
    attempt: int
    rank: int
    workers: int
    acked: Cursor | None = None  # everything before it is stored
    sent: Cursor | None = None  # where the round being sent ends


def _fits(rate: RateLimit, size: int, now: float) -> bool:
    """Whether ``rate`` has room for ``size`` bytes at ``now``, asked of a
    copy: the batcher asks again, the same way, for the lines it is fed."""
    return dataclasses.replace(rate).allow(size, now)


# --------------------------------------------------------------------------- one worker


class PodLog:
    """One worker pod's training container logs, read in order: each
    ``<n>.log`` to its end (through its rotations) before the next."""

    def __init__(self, pod_dir: Path, position: Position, *, node: str, limits: LogLimits,
                 source: str) -> None:
        self.dir = pod_dir / CONTAINER
        self.position = position
        self.batcher = Batcher.for_worker(position.job, position.attempt, position.rank, node,
                                          position.workers, limits, source=source)
        self.joiner = Joiner(limits.max_line_bytes)
        # A chunk is kept or dropped whole: it must fit the bucket a few times over.
        self.read_bytes = max(4096, min(READ_BYTES, int(self.batcher.rate.burst) // 4))
        self.fd: int | None = None
        self.path: Path | None = None  # the open file, under the name it was opened by
        self.gone = False  # the pod directory was removed
        self.done = False  # gone, and everything read
        self.malformed = 0
        self.lost_files = 0
        self._long = False  # inside a record longer than a read
        self._out: list[WorkerLog] = []
        start = position.acked or Cursor()
        self.restart, self.inode, self.offset = start.restart, start.inode, start.offset
        self.head = base64.b64decode(start.head)
        self.clock = start.clock
        self.batcher.seq = start.seq
        if start.rate_last is not None and start.tokens is not None:
            self.batcher.rate.tokens, self.batcher.rate.last = start.tokens, start.rate_last
        for stream, line in start.open.items():
            self.joiner.open[stream] = Unfinished(base64.b64decode(line.raw), line.skipping)
        self.bound = position.sent  # after a restart: read to where the unacked round ended

    def cursor(self) -> Cursor:
        rate = self.batcher.rate
        return Cursor(
            restart=self.restart, file=self.path.name if self.path else "", inode=self.inode,
            head=base64.b64encode(self._head()).decode(),
            offset=self.offset, seq=self.batcher.seq, clock=self.clock,
            tokens=rate.tokens if rate.last is not None else None, rate_last=rate.last,
            open={s: OpenLine(raw=base64.b64encode(o.raw).decode(), skipping=o.skipping)
                  for s, o in self.joiner.open.items()})

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    # ---------------------------------------------------------------- files

    def _names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.dir))
        except OSError:
            return []

    def _restarts(self, after: int = -1) -> list[int]:
        return sorted(n for name in self._names()
                      if (m := _LOG_NAME.match(name)) and (n := int(m[1])) > after)

    def _rotated(self) -> list[Path]:
        """The rotated, still uncompressed files of this container, oldest first
        (their names end in the rotation's time)."""
        prefix = f"{self.restart}.log."
        return [self.dir / n for n in self._names() if n.startswith(prefix) and _ROTATED.match(n)]

    def _live(self) -> Path:
        return self.dir / f"{self.restart}.log"

    def _open(self, path: Path, offset: int) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return False
        st = os.fstat(fd)
        if st.st_size < offset:  # not the file it was (copied and truncated): from its start
            offset = 0
        self.close()
        self.fd, self.path, self.inode, self.offset = fd, path, st.st_ino, offset
        self.head = b""
        return True

    def _head(self) -> bytes:
        """The open file's first HEAD_BYTES (fewer while it is shorter)."""
        if self.fd is not None and len(self.head) < HEAD_BYTES:
            with contextlib.suppress(OSError):
                self.head = os.pread(self.fd, HEAD_BYTES, 0)
        return self.head

    def _is_ours(self, path: Path) -> bool:
        """Whether ``path`` is the file the position names: its inode, and
        (inodes are reused once a file is deleted) the bytes it began with."""
        try:
            if path.stat().st_ino != self.inode:
                return False
            with open(path, "rb") as f:
                return f.read(len(self.head)) == self.head
        except OSError:
            return False

    def _open_first(self) -> bool:
        """Open where the position says (found by inode among the live and
        the rotated files), else the oldest container's log from its start."""
        if self.inode:
            for path in (self._live(), *reversed(self._rotated())):
                if self._is_ours(path):
                    return self._open(path, self.offset)
            self.lost_files += 1  # rotated and compressed, or removed, while away
            get_logger(component="pod-logs").warning(
                "a worker's log file was rotated away unread", job=self.position.job,
                attempt=self.position.attempt, rank=self.position.rank,
                file=f"{self.restart}.log", offset=self.offset)
            self.inode = 0
        restarts = self._restarts(self.restart - 1)
        if not restarts:
            return False
        if restarts[0] != self.restart:
            self._container_ended(restarts[0])
        return self._open(self._live(), 0)

    def _following(self) -> tuple[Path, int] | None:
        """At the end of the open file: the file that follows it, and its
        container's restart count (a rotation's new file, the next rotated
        one when resumed in an older one, or the next container's log);
        None while the open file is still the one written."""
        live = self._live()
        try:
            live_ino = live.stat().st_ino
        except OSError:
            live_ino = 0
        assert self.path is not None
        if self.path == live:
            if live_ino == self.inode:
                later = self._restarts(self.restart)
                return (self.dir / f"{later[0]}.log", later[0]) if later else None
            if live_ino:  # rotated: the runtime writes a new <n>.log
                return live, self.restart
        else:  # resumed in a rotated file: the ones rotated after it, then the live one
            after = [p for p in self._rotated() if p.name > self.path.name]
            if after:
                return after[0], self.restart
            if live_ino:
                return live, self.restart
        later = self._restarts(self.restart)  # its log is gone and a newer container runs
        return (self.dir / f"{later[0]}.log", later[0]) if later else None

    def _container_ended(self, restart: int) -> None:
        for stream, raw in self.joiner.end():
            self._out += self.batcher.feed([raw], stream, self.clock)
        self.restart = restart

    # ---------------------------------------------------------------- reading

    def poll(self, budget: int = ROUND_BYTES) -> list[WorkerLog]:
        """Read what was written since the last round (at most ``budget``
        bytes, except when re-reading an unacknowledged round) and return
        its batches, the last one flushed: a round ends on a batch boundary."""
        self._out = []
        if self.done:
            return []
        if self.bound is not None:
            budget = 1 << 62  # the same lines as before the restart, however many
        while budget > 0:
            if self.fd is None and not self._open_first():
                break
            stop = self._stop_at()
            budget -= self._read(budget, stop)
            if stop is not None and self.offset >= stop:
                self.bound = None
                break
            if budget <= 0:
                break
            nxt = self._following()
            if nxt is None:
                if self.gone:  # nothing more will come: the unfinished lines too
                    self._container_ended(self.restart)
                    self.done = True
                break
            budget -= self._read(budget, stop)  # what came before the switch was seen
            path, restart = nxt
            if restart != self.restart:
                self._container_ended(restart)
            if not self._open(path, 0):
                break
        if self.fd is None and self.gone:
            self.done = True
        self._out += self.batcher.take(self.clock, flush=True)
        return self._out

    def _stop_at(self) -> int | None:
        b = self.bound
        if b is None:
            return None
        if self.restart > b.restart:
            self.bound = None
            return None
        return b.offset if (self.restart, self.inode) == (b.restart, b.inode) else None

    def _read(self, budget: int, stop: int | None) -> int:
        if self.fd is None:
            return 0
        used = 0
        while used < budget:
            want = self.read_bytes if stop is None else min(self.read_bytes, stop - self.offset)
            if want <= 0:
                break
            try:
                data = os.pread(self.fd, want, self.offset)
            except OSError:
                break
            if not data:
                break
            if self._long:  # the rest of a record too long to take
                cut = data.find(b"\n") + 1
                taken = cut or len(data)
                self._long = not cut
            elif not (taken := data.rfind(b"\n") + 1):
                if len(data) < want:
                    break  # a record being written
                self.malformed += 1  # a record longer than a read: skipped
                self._long, taken = True, len(data)
            else:
                self._consume(data[:taken])
            self.offset += taken
            used += taken
        return used

    def _consume(self, chunk: bytes) -> None:
        """Complete records: dropped whole when the rate has no room (counted,
        never split into records), else joined into lines and fed to the
        batcher in runs of one stream."""
        start, first = 0, None
        while start < len(chunk):
            end = chunk.index(b"\n", start) + 1
            if (first := parse_cri(chunk[start:end])) is not None:
                break
            self.malformed += 1
            start = end
        if first is None:
            return
        if start:
            chunk = chunk[start:]
        count = chunk.count(b"\n")
        head = end - start - len(first.text)  # time, stream, tag, newline: about the same each
        size = max(0, len(chunk) - count * head)
        now = max(self.clock, first.time)
        if not _fits(self.batcher.rate, size, now):
            self.clock = now
            self.batcher.drop(count, size)
            self._dropped_tail(chunk.rsplit(b"\n", TAIL_RECORDS + 1)[-TAIL_RECORDS - 1:-1])
            return
        records = chunk.split(b"\n")
        records.pop()
        run: list[bytes] = []
        stream, began = first.stream, now
        for raw in records:
            rec = parse_cri(raw)
            if rec is None:
                self.malformed += 1
                continue
            self.clock = max(self.clock, rec.time)
            line = self.joiner.add(rec)
            if line is None:
                continue
            if run and (rec.stream != stream or self.clock - began > GROUP_S):
                self._out += self.batcher.feed(run, stream, began)
                run = []
            if not run:
                stream, began = rec.stream, self.clock
            run.append(line)
        if run:
            self._out += self.batcher.feed(run, stream, began)

    def _dropped_tail(self, tail: list[bytes]) -> None:
        """After a dropped chunk (``tail``: its last records): an open line of
        either stream is lost, and where the chunk ended inside one, the rest
        of it is skipped too. Only the last records are looked at: a stream
        silent in them is taken to have no line open."""
        self.joiner.open.clear()
        seen: set[Stream] = set()
        for raw in reversed(tail):
            rec = parse_cri(raw)
            if rec is None or rec.stream in seen:
                continue
            seen.add(rec.stream)
            if rec.partial:
                self.joiner.skip(rec.stream)
