"""Human reasons for pending jobs.

An operator reading ``primus-safe explain JOB`` should learn what the job
waits for in the cluster's own terms: how many GPUs in which shape, and what
is free or held right now. Reasons are built from numbers the policy already
has (a ``Shortfall``, quota counters, the blocking job), never by re-deciding.
"""

from __future__ import annotations

import math

from .placement import Shortfall
from .request import Request
from .state import ClusterState
from .topology import rack_label


def models_phrase(req: Request) -> str:
    if req.job.gpu_models:
        return f" with GPU model {' or '.join(sorted(req.job.gpu_models))}"
    return ""


def capacity(state: ClusterState, req: Request, short: Shortfall) -> str:
    """E.g. "needs 64 GPUs in one rack; largest free block is 40 in rack r3"."""
    job = req.job
    need = req.need
    shape = (f"{job.workers} workers x {job.gpus_per_worker} GPUs" if job.workers > 1
             else f"1 worker x {job.gpus_per_worker} GPUs")
    where = models_phrase(req)
    if req.exclude:
        where += f", {len(req.exclude)} node(s) excluded"
    if short.free_gpus < need:
        return f"needs {need} GPUs ({shape}); {short.free_gpus} free on ready nodes{where}"
    block = _block(state, short)
    most = f"at most {short.most_on_a_node} free on one node"
    if req.rack_unit > 1:
        unit_gpus = req.rack_unit * req.slot_gpus
        if req.units == 1:
            return f"needs {unit_gpus} GPUs in one rack; largest free block is {block}"
        return (f"needs {req.units} units of {unit_gpus} GPUs, each in one rack; free GPUs "
                f"hold {short.fit_units} (largest free block is {block})")
    if req.workers_per_slot > 1:
        return (f"needs {req.slots} units of {req.workers_per_slot} workers x "
                f"{job.gpus_per_worker} GPUs, each unit on one node; free GPUs{where} hold "
                f"{short.fit_units} such units ({most})")
    if job.workers == 1:
        return (f"needs {need} GPUs on one node{where}; {most} "
                f"({short.free_gpus} free in total)")
    return (f"needs {shape}, each worker on one node; the {short.free_gpus} free GPUs{where} "
            f"hold only {short.fit_units} such workers ({most})")


def _block(state: ClusterState, short: Shortfall) -> str:
    if short.best_rack < 0:
        return "0"
    return f"{short.best_rack_gpus} in rack {rack_label(state.rack_names[short.best_rack])}"


def quota(ws: str, used: int, cap: int, need: int, model: str | None = None,
          reserved: int = 0) -> str:
    scope = f" for {model}" if model else ""
    held = f" (+{reserved} kept for an earlier job)" if reserved else ""
    return f"workspace quota{scope}: {used}/{cap} GPUs used{held}, needs {need}"


def behind(blocker: str, ws: str) -> str:
    return f"behind {blocker} in the FIFO queue of workspace {ws}"


def held(owners: list[str], until: float, now: float) -> str:
    owners = sorted(owners)
    who = ", ".join(owners[:3]) + (" ..." if len(owners) > 3 else "")
    if math.isinf(until):
        when = "jobs with an expected runtime may borrow them"
    else:
        when = f"only jobs expected to end within {until - now:.0f}s may borrow them"
    return f"fits only on GPUs held for {who} (ahead in the queue); {when}"


def waiting(owners: list[str]) -> str:
    owners = sorted(owners)
    who = ", ".join(owners[:3]) + (" ..." if len(owners) > 3 else "")
    return f"placed; waiting for preempted {who} to checkpoint and release GPUs"


def preempting(victims: list[str]) -> str:
    who = ", ".join(victims[:3]) + (f" and {len(victims) - 3} more" if len(victims) > 3 else "")
    return f"preempting {who} (lower priority); starts when they checkpoint and exit"


def holding(gpus: int, racks: list[str], until: float, now: float) -> str:
    where = ", ".join(racks[:3]) + (" ..." if len(racks) > 3 else "")
    eta = "" if math.isinf(until) else f", expected usable in {max(0.0, until - now):.0f}s"
    return f"; draining rack {where} for it ({gpus} GPUs held now{eta})"
