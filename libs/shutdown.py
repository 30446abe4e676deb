"""A stop asked for before a service's event loop can hear it.

A service process spends its first seconds importing (torch for the bench
agent, the ClickHouse engine for lens-collector) before ``run_service``
installs its SIGTERM handler; a SIGTERM then (a stack stopped right after it
started, a rollout that replaces a pod still starting) would kill it with
-15 instead of a clean stop. ``catch_early`` turns that SIGTERM into a flag
that ``run_service`` reads once its own handler is in place. Standard
library only, so it can be installed before anything heavy is imported.
"""

from __future__ import annotations

import signal
import threading

_asked = threading.Event()


def catch_early() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: _asked.set())


def asked() -> bool:
    """Whether a stop came before the service could handle it itself."""
    return _asked.is_set()
