"""Pausing Python's cyclic garbage collector around bulk work.

The collector runs whenever enough container objects have been allocated,
and its older generations walk every live object of the process. Work that
builds many young objects that are not garbage (a YAML document's nodes, a
scheduling cycle's view of every node and rack) pays for those walks again
and again: a third to two thirds of the work's time in this project's
measurements. Reference counting still frees what becomes unreachable while
paused; only reference cycles wait for the collector's next run.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic collection inside the block; the collector's previous
    state (on, or already off) is restored after it, errors included."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
