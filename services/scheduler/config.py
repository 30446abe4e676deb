"""The scheduler's configuration file: priority classes, workspaces (quota,
node pools, queue policy, preemption) and preemption timing. Loaded once at
start from ``PRIMUS_SCHEDULER_CONFIG`` (YAML); without a file there is one
``default`` workspace with FIFO, no quota and preemption on.

``pools`` may declare what a node pool will ever hold (GPUs per model): a job
beyond that is refused at submit; without a declaration the registered nodes
are all the scheduler knows, and a job beyond them is accepted as
unschedulable (see ``policy.admission``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from libs.events import Frozen
from libs.specs import load_model
from libs.workload import Network, Resources, Toleration, check_names, check_node_selector, quantity
from services.scheduler.lifecycle import Limits
from services.scheduler.policy import SchedulerConfig, Workspace
from services.scheduler.policy.model import DEFAULT_PRIORITIES


class WorkloadDefaults(Frozen):
    """What a job gets for each workload field it leaves unset (the
    cluster's, then its workspace's; the job's own value wins). ``env`` and
    ``network`` are merged key by key, node selectors and tolerations and
    pull secrets are added together."""

    image: str | None = Field(default=None, description="the default training image")
    resources: Resources = Field(default_factory=Resources)
    host_network: bool | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    image_pull_secrets: list[str] = Field(default_factory=list)
    network: Network = Field(default_factory=Network, description="NCCL/RCCL fabric settings")
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint_pvc: str | None = Field(
        default=None, description="a ReadWriteMany claim every attempt of a job mounts for its "
        "checkpoints; without one a job re-placed by failover starts from scratch")

    @model_validator(mode="after")
    def _names(self) -> WorkloadDefaults:
        check_node_selector(self.node_selector)
        check_names(self.image_pull_secrets, "image pull secret")
        if self.checkpoint_pvc:
            check_names([self.checkpoint_pvc], "checkpoint_pvc")
        return self


class WorkloadLimits(Frozen):
    """The most a job of the workspace may ask for, per worker; a job above a
    limit is refused at submit with the limit named."""

    cpu: str | None = None
    memory: str | None = None
    shared_memory: str | None = None
    ephemeral_storage: str | None = None
    extra: dict[str, int] | None = Field(
        default=None, description="extended resources allowed and the most per worker; unset: "
        "any, {}: none")
    host_network: bool = Field(default=False, description="may workers use the node's network")
    host_paths: list[str] = Field(
        default_factory=list, description="node directories (and below) a volume may mount; "
        "empty: no hostPath volumes")

    @model_validator(mode="after")
    def _check(self) -> WorkloadLimits:
        for name in ("cpu", "memory", "shared_memory", "ephemeral_storage"):
            value = getattr(self, name)
            if value is not None:
                quantity(value)
        bad = [p for p in self.host_paths if not p.startswith("/")]
        if bad:
            raise ValueError(f"host_paths must be absolute: {', '.join(bad)}")
        return self


class WorkspaceConfig(Frozen):
    name: str
    workload: WorkloadDefaults = Field(default_factory=WorkloadDefaults)
    limits: WorkloadLimits = Field(default_factory=WorkloadLimits)
    quota_gpus: int | None = Field(default=None, ge=0, description="GPUs in use at most")
    quota_by_model: dict[str, int] = Field(default_factory=dict)
    node_pools: list[str] = Field(default_factory=list, description="empty: every pool")
    queue_policy: Literal["fifo", "balance"] = "fifo"
    preemption: bool = True

    def policy(self) -> Workspace:
        return Workspace(name=self.name, quota_gpus=self.quota_gpus,
                         quota_by_model=dict(self.quota_by_model),
                         node_pools=frozenset(self.node_pools), queue_policy=self.queue_policy,
                         preemption=self.preemption)


class PoolConfig(Frozen):
    name: str
    gpus_by_model: dict[str, int] = Field(
        default_factory=dict, description="the most GPUs of each model this pool will ever hold")

    @model_validator(mode="after")
    def _check(self) -> PoolConfig:
        bad = sorted(m for m, g in self.gpus_by_model.items() if g < 0)
        if bad:
            raise ValueError(f"pool {self.name}: gpus_by_model must be >= 0 ({', '.join(bad)})")
        return self


class SchedulerFile(Frozen):
    priorities: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_PRIORITIES))
    preemption: bool = True
    cross_workspace_preemption: bool = False
    preempt_larger_jobs: bool = Field(
        default=False, description="let a job preempt one holding more GPUs than it asks "
        "for (off: the victim's GPUs would mostly go to other small jobs while it waits for a "
        "whole node again)")
    fragmentation_aware: bool = Field(
        default=True, description="place single-node requests on the GPU model pinned "
        "jobs need least (or whose GPUs left over by them are least in use) and where they "
        "fragment the cluster least for the running and queued job shapes (off: the "
        "tightest node)")
    whole_node_holds: int = Field(
        default=2, ge=0, description="how many blocked one-node jobs of a balance queue that "
        "fill a whole node hold a node to drain at once, ahead of smaller jobs before them "
        "(0: only the first blocked job of each queue holds capacity)")
    preemption_grace_s: float = Field(default=30.0, ge=0,
                                      description="time a victim has to checkpoint and stop")
    stop_grace_s: float = Field(
        default=30.0, ge=0, description="time a job an operator stops, cancels or deletes (or "
        "one past its max_runtime_s) has to checkpoint before SIGKILL")
    launch_retry_s: float = Field(
        default=30.0, gt=0, description="a launch the cluster refused before creating "
        "anything (a missing Secret or claim) is tried again this long after")
    degraded_nodes: Literal["last", "never"] = Field(
        default="last", description="nodes whose bench was degraded (below their fleet): "
        "last: used only when healthy nodes cannot hold a gang; never: not used")
    workload: WorkloadDefaults = Field(
        default_factory=WorkloadDefaults, description="every workspace's defaults (a "
        "workspace's own win)")
    workspaces: list[WorkspaceConfig] = Field(
        default_factory=lambda: [WorkspaceConfig(name="default")], min_length=1)
    pools: list[PoolConfig] = Field(default_factory=list,
                                    description="declared pool capacity (optional)")

    @model_validator(mode="after")
    def _check(self) -> SchedulerFile:
        names = [w.name for w in self.workspaces]
        if len(set(names)) != len(names):
            raise ValueError("workspace names must be unique")
        pools = [p.name for p in self.pools]
        if len(set(pools)) != len(pools):
            raise ValueError("pool names must be unique")
        missing = {"low", "medium", "high"} - set(self.priorities)
        if missing:
            raise ValueError(f"priorities must define {', '.join(sorted(missing))}")
        return self

    def policy(self) -> SchedulerConfig:
        return SchedulerConfig(priorities=dict(self.priorities), preemption=self.preemption,
                               cross_workspace_preemption=self.cross_workspace_preemption,
                               preempt_larger_jobs=self.preempt_larger_jobs,
                               fragmentation_aware=self.fragmentation_aware,
                               whole_node_holds=self.whole_node_holds)

    def limits(self) -> Limits:
        return Limits(preemption_grace_s=self.preemption_grace_s, stop_grace_s=self.stop_grace_s,
                      launch_retry_s=self.launch_retry_s)

    def pool_capacity(self) -> dict[str, dict[str, int]]:
        """Declared pools: pool -> GPU model -> the most GPUs it will hold."""
        return {p.name: dict(p.gpus_by_model) for p in self.pools}

    def workspace_policies(self) -> list[Workspace]:
        return [w.policy() for w in self.workspaces]


def load(path: Path | None) -> SchedulerFile:
    return SchedulerFile() if path is None else load_model(path, SchedulerFile)
