"""Carries out cordons and uncordons through the node driver, one worker
per node: a node's changes happen in the order they were asked, a node whose
API calls fail (retried with back-off until they succeed) holds up no other
node, and nothing here holds up failover's events — a cordon is asked for
and done meanwhile. Each change is idempotent, so asking twice is harmless."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Literal

from libs.drivers.nodes import NodeDriver
from libs.logs import get_logger
from libs.tasks import cancel_and_wait

Action = tuple[Literal["cordon", "uncordon"], str, str]  # (action, fault kind, reason)


class Cordons:
    def __init__(self, driver: NodeDriver, *, max_backoff_s: float = 30.0) -> None:
        self.driver = driver
        self.max_backoff_s = max_backoff_s
        self.done = 0  # changes carried out (or found already made)
        self._queues: dict[str, deque[Action]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._log = get_logger(component="cordons")

    def cordon(self, node: str, kind: str, reason: str) -> None:
        self._ask(node, ("cordon", kind, reason))

    def uncordon(self, node: str, kind: str) -> None:
        self._ask(node, ("uncordon", kind, ""))

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def idle(self) -> None:
        """Until every change asked for is done (tests)."""
        while self._workers:
            await asyncio.gather(*self._workers.values(), return_exceptions=True)

    async def close(self) -> None:
        await cancel_and_wait(list(self._workers.values()))
        self._workers.clear()

    def _ask(self, node: str, action: Action) -> None:
        self._queues.setdefault(node, deque()).append(action)
        if node not in self._workers:
            self._workers[node] = asyncio.create_task(self._work(node))

    async def _work(self, node: str) -> None:
        queue = self._queues[node]
        try:
            while queue:
                await self._carry_out(node, queue[0])
                queue.popleft()
                self.done += 1
        finally:
            self._workers.pop(node, None)
            if not queue:
                self._queues.pop(node, None)

    async def _carry_out(self, node: str, action: Action) -> None:
        what, kind, reason = action
        backoff = 0.5
        while True:
            try:
                changed = await (self.driver.cordon(node, kind, reason) if what == "cordon"
                                 else self.driver.uncordon(node, kind))
            except Exception as exc:
                self._log.warning(f"{what} failed; trying again", node=node, kind=kind,
                                  error=repr(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff_s, backoff * 2)
                continue
            if changed:
                self._log.info(f"node {what}ed", node=node, kind=kind)
            return
