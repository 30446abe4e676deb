"""A local worker's stdout and stderr: into its rank log file (capped and
rotated) and, in batches, to Lens over the bus. Run by the worker's
supervisor (``local_worker``), one reader thread per stream.

The readers take whatever the pipe holds (up to 256 KiB a read) and never
wait on the bus: batches go to the SDK's publisher, whose bounded queue
drops (and counts) when the bus cannot keep up, so a worker printing
100 MB/s runs as fast as it would into a file. Everything the worker
printed reaches the file; Lens gets what the job's log rate allows
(``libs.log_shipper``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

from libs.events import LogStream, WorkerLog
from libs.log_shipper import Batcher, LineSplitter

READ_BYTES = 256 << 10


class RotatingFile:
    """Appends bytes to ``path``; at ``max_bytes`` it becomes ``path.1``
    (``path.1`` becomes ``path.2``, ... ``keep`` of them), so a chatty
    worker cannot fill the disk."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            os.write(self._fd, data)
            self._size += len(data)

    def _rotate(self) -> None:
        os.close(self._fd)
        for i in range(self.keep, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            newer = self.path.with_name(f"{self.path.name}.{i - 1}") if i > 1 else self.path
            if i == self.keep:
                older.unlink(missing_ok=True)
            if newer.exists():
                os.replace(newer, older)
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = 0

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            os.close(self._fd)


class OutputPump:
    """Reads a worker's streams into the file and the batcher, and offers
    each batch to ``publisher`` (anything with ``offer(event) -> bool``)."""

    def __init__(self, file: RotatingFile, batcher: Batcher | None, publisher: Any) -> None:
        self.file, self.batcher, self.publisher = file, batcher, publisher
        self.unsent = 0  # batches the publisher's queue had no room for
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, streams: dict[LogStream, IO[bytes]]) -> None:
        for name, pipe in streams.items():
            t = threading.Thread(target=self._read, args=(name, pipe), daemon=True,
                                 name=f"output-{name}")
            t.start()
            self._threads.append(t)
        if self.batcher is not None:
            ticker = threading.Thread(target=self._tick, daemon=True, name="output-flush")
            ticker.start()

    def _read(self, stream: LogStream, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        splitter = LineSplitter(self.batcher.limits.max_line_bytes if self.batcher else 1 << 20)
        partial = b""  # the file gets whole lines: the other stream's never split one
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                break
            end = chunk.rfind(b"\n") + 1
            if end:
                self.file.write(partial + chunk[:end] if partial else chunk[:end])
                partial = chunk[end:]
            else:
                partial += chunk
                if len(partial) > READ_BYTES:  # no newline in sight: do not hold it all
                    self.file.write(partial)
                    partial = b""
            if self.batcher is not None:
                lines = splitter.split(chunk)
                if lines:
                    self._send(lambda lines=lines: self.batcher.feed(lines, stream, time.time()))
        if partial:
            self.file.write(partial + b"\n")
        if self.batcher is not None:
            rest = splitter.end()
            if rest:
                self._send(lambda: self.batcher.feed(rest, stream, time.time()))

    def _send(self, make: Any) -> None:
        with self._lock:  # one batcher for both streams: lines keep one numbering
            batches: list[WorkerLog] = make()
        for batch in batches:
            if not self.publisher.offer(batch):
                self.unsent += 1

    def _tick(self) -> None:
        assert self.batcher is not None
        batcher = self.batcher
        while not self._stop.wait(batcher.limits.flush_s / 2):
            self._send(lambda: batcher.take(time.time()))

    def finish(self, timeout_s: float = 2.0) -> None:
        """After the worker exited: read what its pipes still hold, send the
        last batch, close the file. A process the worker left behind may
        hold its pipes open: its output is not waited for."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        if self.batcher is not None:
            batcher = self.batcher
            self._send(lambda: batcher.take(time.time(), flush=True))
        self.file.close()
