"""Watch a job's checkpoint directory and say when its newest complete
checkpoint changes, whichever framework wrote it (``checkpoint_layouts``).

The watch is the kernel's (inotify, through ``watchdog``): nothing is read
until something under the directory changes. A checkpoint is many files
written over seconds, so changes are gathered until the directory has been
quiet for ``settle_s``, then it is scanned once (one level, a few marker
files: cheap) and ``on_change`` hears of a checkpoint newer than the last
one told. A job that saves every few minutes thus costs a scan every few
minutes; one that writes nothing costs nothing.

On a network filesystem inotify hears only this machine's writes, so a
watch may also look every ``poll_s`` seconds (a slow safety net, not the
mechanism). A directory that does not exist yet (a read-only mount the
job has not written to) is watched from when it appears.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from libs.checkpoint_layouts import Found, discover, resume_step
from libs.events import JobCheckpoint, JobCheckpointData
from libs.logs import get_logger

OnChange = Callable[[Found, int, datetime], Awaitable[None]]  # found, its step, saved at


class _Wake(FileSystemEventHandler):
    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self.loop, self.event = loop, event

    def on_any_event(self, event: FileSystemEvent) -> None:  # a watchdog thread
        if event.event_type not in ("opened", "closed_no_write"):  # reads change nothing
            self.loop.call_soon_threadsafe(self.event.set)


class CheckpointWatch:
    """One job's directory; ``start`` and ``stop`` around its run."""

    def __init__(self, directory: Path, on_change: OnChange, *,
                 world_size: int | None = None, settle_s: float = 1.0,
                 poll_s: float | None = None, create: bool = True) -> None:
        self.directory, self.on_change = directory, on_change
        self.world_size, self.settle_s = world_size, settle_s
        self.poll_s, self.create = poll_s, create
        self._watching = False
        self.last: tuple[int, str] | None = None  # (step, path) last told
        self._observer: Observer | None = None  # type: ignore[valid-type]
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger(component="checkpoint-watch", directory=str(directory))

    async def start(self) -> None:
        if self.create:
            self.directory.mkdir(parents=True, exist_ok=True)
        changed = asyncio.Event()
        self._wake = _Wake(asyncio.get_running_loop(), changed)
        observer = Observer()
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._schedule()
        changed.set()  # what is there already (a restart, a resumed job)
        self._task = asyncio.create_task(self._run(changed))

    def _schedule(self) -> None:
        if self._watching or self._observer is None or not self.directory.is_dir():
            return
        self._observer.schedule(self._wake, str(self.directory), recursive=True)
        self._watching = True

    async def _run(self, changed: asyncio.Event) -> None:
        while True:
            if self.poll_s is None:
                await changed.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), self.poll_s)
            try:
                self._schedule()  # the directory may have appeared since start
            except OSError as exc:  # inotify limits: polled next time
                self._log.warning("checkpoint directory not watched", error=repr(exc))
            # Quiet for settle_s: a checkpoint being written keeps waking us.
            while True:
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), self.settle_s)
                except TimeoutError:
                    break
            try:
                await self._check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # told next time; never kill the watch
                self._log.warning("checkpoint check failed", error=repr(exc))

    async def _check(self) -> None:
        found = await asyncio.to_thread(discover, self.directory, world_size=self.world_size)
        step = resume_step(found)
        if found is None or step is None or (step, found.path) == self.last:
            return
        if self.last is not None and step < self.last[0]:
            return  # an older one reappeared (a copy, a rename): not news
        saved_at = await asyncio.to_thread(_newest_mtime, Path(found.path))
        self.last = (step, found.path)
        await self.on_change(found, step, saved_at)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._observer is not None:
            self._observer.stop()
            await asyncio.to_thread(self._observer.join, 5)


def checkpoint_event(job: str, attempt: int, found: Found, step: int, saved_at: datetime, *,
                     source: str, node: str | None = None) -> JobCheckpoint:
    """The announcement of a checkpoint found; its id is the same whoever
    finds it (the local driver, an agent, a restarted one): told once."""
    return JobCheckpoint(
        id=f"{job}-checkpoint-{found.layout}-{step}", source=source, job=job, node=node,
        data=JobCheckpointData(attempt=attempt, iteration=step, path=found.path,
                               layout=found.layout, saved_at=saved_at))


def _newest_mtime(path: Path) -> datetime:
    """When the checkpoint was complete: its newest file's modification
    time (a checkpoint's files, at most a few thousand, one level deep)."""
    newest = 0.0
    with contextlib.suppress(OSError):
        newest = path.stat().st_mtime
        with os.scandir(path) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return datetime.fromtimestamp(newest, UTC)
