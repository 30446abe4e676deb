"""CRI container log records into a worker's lines (pure: bytes in, lines
out; no file, no clock).

The container runtimes (containerd, CRI-O) write a container's stdout and
stderr for the kubelet as one record a line:
``<RFC3339Nano time> <stdout|stderr> <P|F>[:tags] <text>``, where ``P``
marks a piece of a line the runtime split (at its maximum record size, or
because the line was not finished yet): the same stream's next record
continues it. ``parse_cri`` reads a record as the kubelet does
(pkg/kubelet/kuberuntime/logs/logs.go, ``parseCRILog``); ``Joiner`` puts
the pieces back together. ``services.bench.pod_log_reader`` uses both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class CriRecord:
    """One record of a CRI container log file."""

    time: float  # seconds since the epoch
    stream: Stream
    partial: bool  # P: the line goes on in this stream's next record
    text: bytes  # without the record's newline


def parse_cri(line: bytes) -> CriRecord | None:
    """One line of a CRI log file (with or without its newline); None when
    it is not one. Pure. As the kubelet reads them (pkg/kubelet/kuberuntime/
    logs/logs.go, parseCRILog): the tag is the first of ``:``-separated
    tags, only ``P`` is partial, and the space after the tag is required."""
    if line.endswith(b"\n"):
        line = line[:-1]
    parts = line.split(b" ", 3)
    if len(parts) != 4 or parts[1] not in (b"stdout", b"stderr"):
        return None
    try:
        stamp = datetime.fromisoformat(parts[0].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if stamp.tzinfo is None:  # RFC 3339 always has an offset
        return None
    stream: Stream = "stdout" if parts[1] == b"stdout" else "stderr"
    return CriRecord(stamp.timestamp(), stream, parts[2].split(b":", 1)[0] == b"P", parts[3])


@dataclass
class Unfinished:
    """A line whose P records came, not yet its F."""

    raw: bytes
    skipping: bool = False  # cut already: the rest of the line is not kept


@dataclass
class Joiner:
    """P records into whole lines, one open line per stream (the runtime
    splits stdout and stderr apart). Pure. A line growing past
    ``max_bytes`` is let out at once (the batcher cuts it, its marker
    counting what came so far) and the rest of it is skipped, so a worker
    printing without newlines cannot grow memory."""

    max_bytes: int
    open: dict[Stream, Unfinished] = field(default_factory=dict)

    def add(self, rec: CriRecord) -> bytes | None:
        """The line ``rec`` completes, if any."""
        cur = self.open.get(rec.stream)
        if cur is not None and cur.skipping:
            if not rec.partial:
                del self.open[rec.stream]
            return None
        raw = cur.raw + rec.text if cur is not None else rec.text
        if not rec.partial:
            self.open.pop(rec.stream, None)
            return raw
        if len(raw) > self.max_bytes:
            self.open[rec.stream] = Unfinished(b"", skipping=True)
            return raw
        self.open[rec.stream] = Unfinished(raw)
        return None

    def skip(self, stream: Stream) -> None:
        """The records up to this stream's next F belong to a dropped line."""
        self.open[stream] = Unfinished(b"", skipping=True)

    def end(self) -> list[tuple[Stream, bytes]]:
        """The container ended: its unfinished lines, as they are."""
        out = [(s, o.raw) for s, o in self.open.items() if not o.skipping and o.raw]
        self.open.clear()
        return out


