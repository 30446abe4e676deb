"""A job's workload settings after its workspace's defaults and limits
(pure). The scheduler resolves every job once, when it accepts it: the
record then holds exactly what its pods get, whatever the configuration
becomes later; ``primus-safe submit`` asks the same question first, so a
job above a limit is refused before it has an id, the limit named.

Precedence: the job's own value, then its workspace's default, then the
cluster's (``workload`` at the top of the scheduler file). Environment and
network settings merge key by key (the job's win); node selectors,
tolerations and pull secrets add up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import PurePosixPath

from libs.events import JobSpec
from libs.resume import uses
from libs.workload import Resources, Toleration, quantity
from services.scheduler.config import WorkloadDefaults, WorkloadLimits, WorkspaceConfig


@dataclass(frozen=True)
class Resolution:
    """The job as it will run, or why it may not (``field``: the job file's
    field, dotted, for the CLI to find its line)."""

    spec: JobSpec | None
    reason: str = ""
    field: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _tolerations(*groups: list[Toleration]) -> list[Toleration]:
    out: list[Toleration] = []
    for group in groups:
        out += [t for t in group if t not in out]
    return out


def merged(spec: JobSpec, cluster: WorkloadDefaults, ws: WorkloadDefaults) -> JobSpec:
    """``spec`` with every unset workload field filled from the workspace's,
    then the cluster's defaults."""
    env = {**cluster.network.env(), **cluster.env, **ws.network.env(), **ws.env, **spec.env}
    host_network = next((v for v in (spec.host_network, ws.host_network, cluster.host_network)
                         if v is not None), False)
    return spec.model_copy(update={
        "image": spec.image or ws.image or cluster.image,
        "resources": spec.resources.over(ws.resources).over(cluster.resources),
        "host_network": host_network,
        "node_selector": {**cluster.node_selector, **ws.node_selector, **spec.node_selector},
        "tolerations": _tolerations(cluster.tolerations, ws.tolerations, spec.tolerations),
        "image_pull_secrets": _unique([*cluster.image_pull_secrets, *ws.image_pull_secrets,
                                       *spec.image_pull_secrets]),
        "env": env,
        "checkpoint_pvc": spec.checkpoint_pvc or ws.checkpoint_pvc or cluster.checkpoint_pvc,
    })


def over_limits(spec: JobSpec, ws: str, limits: WorkloadLimits) -> tuple[str, str] | None:
    """The first limit of workspace ``ws`` the (merged) spec is above, as
    (field, reason); None when it fits them all."""
    res: Resources = spec.resources
    for name in ("cpu", "memory", "shared_memory", "ephemeral_storage"):
        asked, most = getattr(res, name), getattr(limits, name)
        if asked is not None and most is not None and quantity(asked) > quantity(most):
            return (f"resources.{name}", f"resources.{name} {asked} is above workspace {ws}'s "
                                         f"limit of {most} per worker (limits.{name})")
    if limits.extra is not None:
        for name, amount in res.extra.items():
            if name not in limits.extra:
                allowed = ", ".join(sorted(limits.extra)) or "none"
                return ("resources.extra", f"resource {name} is not allowed in workspace {ws} "
                                           f"(limits.extra allows: {allowed})")
            if amount > limits.extra[name]:
                return ("resources.extra", f"resources.extra {name}: {amount} is above "
                                           f"workspace {ws}'s limit of {limits.extra[name]} per "
                                           f"worker (limits.extra)")
    if spec.host_network and not limits.host_network:
        return ("host_network", f"workspace {ws} does not allow host_network "
                                "(limits.host_network in the scheduler configuration)")
    for i, volume in enumerate(spec.volumes):
        if volume.host_path is None:
            continue
        path = PurePosixPath(volume.host_path)
        if not any(path == PurePosixPath(p) or PurePosixPath(p) in path.parents
                   for p in limits.host_paths):
            allowed = ", ".join(limits.host_paths) or "none"
            return (f"volumes.{i}.host_path",
                    f"volume {volume.name}: host_path {volume.host_path} is not allowed in "
                    f"workspace {ws} (limits.host_paths allows: {allowed})")
    return None


def resolve(spec: JobSpec, workspace: WorkspaceConfig, cluster: WorkloadDefaults, *,
            kubernetes: bool, fallback_checkpoint_pvc: str | None = None) -> Resolution:
    """The job as it will run in ``workspace``, or why it may not.
    ``kubernetes``: the cluster runs pods (a job without a shared checkpoint
    volume gets a warning); ``fallback_checkpoint_pvc``: the driver's own
    setting, used when neither the job nor the configuration names one."""
    full = merged(spec, cluster, workspace.workload)
    if kubernetes and uses(full.command, "{resume_step}"):
        return Resolution(None, "{resume_step} in the command is filled by the local driver "
                                "only: on Kubernetes the driver cannot read the checkpoint claim "
                                "before the pods start; pass {checkpoint_dir} to the "
                                "framework's own resume flag (e.g. --load {checkpoint_dir})",
                          "command")
    problem = over_limits(full, workspace.name, workspace.limits)
    if problem is not None:
        return Resolution(None, problem[1], problem[0])
    warnings = []
    if kubernetes and not (full.checkpoint_pvc or fallback_checkpoint_pvc):
        warnings.append(f"workspace {workspace.name} names no shared checkpoint volume "
                        "(workload.checkpoint_pvc): checkpoints live in the pod, and a job "
                        "failover re-places starts from scratch")
    return Resolution(full, warnings=warnings)
