"""Kubernetes: the checkpoint directories of the jobs whose rank 0 runs on
this node, watched by this node's agent.

The scheduler's Kubernetes driver cannot read a job's checkpoint claim (it
is mounted in the pods only), so the agents watch it: the chart mounts the
shared claim read-only at ``Settings.agent_checkpoints_dir``, each job's
checkpoints under ``jobs/<job>`` (``k8s_manifests.checkpoint_subpath``).
Only the agent of the node running rank 0 watches a job — rank 0 writes the
trackers (Megatron's, DeepSpeed's) on that node, where inotify sees them;
the watch also looks every ``POLL_S`` for writers elsewhere (a network
filesystem tells inotify only of this machine's writes). A newer complete
checkpoint is announced as ``job.checkpoint`` (failover's lost-work
accounting, Lens), exactly as the local driver does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from libs.checkpoint_layouts import Found
from libs.checkpoint_watch import CheckpointWatch, checkpoint_event
from libs.drivers.k8s_manifests import checkpoint_subpath
from libs.events import JobCheckpoint
from libs.logs import get_logger

POLL_S = 60.0
Publish = Callable[[JobCheckpoint], Awaitable[object]]


class CheckpointWatches:
    def __init__(self, root: Path, node: str, publish: Publish, *, poll_s: float = POLL_S,
                 settle_s: float = 2.0) -> None:
        self.root, self.node, self.publish = root, node, publish
        self.poll_s, self.settle_s = poll_s, settle_s
        self.watches: dict[str, CheckpointWatch] = {}
        self.attempts: dict[str, int] = {}
        self.announced = 0
        self._log = get_logger(component="checkpoint-watches", node=node)

    async def sync(self, leading: dict[str, int]) -> None:
        """Watch exactly the jobs in ``leading`` (job -> attempt whose rank 0
        runs here)."""
        for job in sorted(set(self.watches) - set(leading)):
            await self.watches.pop(job).stop()
            self.attempts.pop(job, None)
        for job, attempt in leading.items():
            self.attempts[job] = attempt
            if job not in self.watches:
                watch = CheckpointWatch(self.root / checkpoint_subpath(job), self._teller(job),
                                        settle_s=self.settle_s, poll_s=self.poll_s,
                                        create=False)
                self.watches[job] = watch
                await watch.start()

    def _teller(self, job: str) -> Callable[[Found, int, datetime], Awaitable[None]]:
        async def tell(found: Found, step: int, saved_at: datetime) -> None:
            await self.publish(checkpoint_event(job, self.attempts.get(job, 1), found, step,
                                                saved_at, source=f"bench-agent/{self.node}",
                                                node=self.node))
            self.announced += 1
            self._log.info("checkpoint found", job=job, step=step, layout=found.layout)
        return tell

    async def close(self) -> None:
        await self.sync({})

    def snapshot(self) -> dict[str, int]:
        return dict(self.attempts)
