"""Bulk work runs with Python's cyclic garbage collector paused (see
``libs/gc_pause.py``), and the collector's state comes back afterwards."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from libs.gc_pause import paused_gc
from libs.settings import Settings
from services.scheduler import app


@pytest.fixture
def collector_runs() -> Iterator[list[str]]:
    """Every start of a cyclic collection while the test runs."""
    runs: list[str] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            runs.append(phase)

    gc.callbacks.append(seen)
    try:
        yield runs
    finally:
        gc.callbacks.remove(seen)


def _cyclic_garbage(n: int) -> None:
    for _ in range(n):
        a: list[Any] = []
        a.append(a)


def test_no_collection_runs_inside_and_the_collector_runs_again_after(
        collector_runs: list[str]) -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        _cyclic_garbage(100_000)  # far past the youngest generation's threshold
        assert collector_runs == []
    assert gc.isenabled()
    _cyclic_garbage(100_000)
    assert collector_runs, "the collector did not run again after the pause"


def test_the_collector_comes_back_after_an_error_and_stays_off_if_it_was() -> None:
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # someone else's pause is not ended by ours
    finally:
        gc.enable()


async def test_a_scheduling_cycle_runs_with_the_collector_paused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler builds a fresh view of every node and job each cycle;
    the policy must run inside the pause, and the collector come back."""
    during: list[bool] = []
    real = app.schedule

    def spy(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(app, "schedule", spy)
    await app.Scheduler(Settings()).cycle()
    assert during == [False]
    assert gc.isenabled()
