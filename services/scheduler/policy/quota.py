"""Workspace quotas: whether a job fits its workspace's GPU budget now, ever,
and how much the workspace must give back first.

Quotas cap the GPUs a workspace holds (running, placed this cycle, or
nominated; GPUs being released by preempted jobs no longer count), in total
and, when ``quota_by_model`` is set, per GPU model (models it does not list
are off limits). ``reserved`` keeps room for a workspace's first
quota-blocked job so smaller jobs behind it cannot use the quota it waits
for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from . import explain
from .model import Workspace
from .request import Request
from .state import ClusterState


def room_for(state: ClusterState, ws: Workspace, model: str | None,
             reserved: Mapping[str, int]) -> int | None:
    """GPUs the workspace may still take (on ``model`` if given); None: no cap."""
    left: int | None = None
    if ws.quota_gpus is not None:
        left = ws.quota_gpus - state.ws_used.get(ws.name, 0) - reserved.get(ws.name, 0)
    if model is not None and ws.quota_by_model:
        cap = ws.quota_by_model.get(model, 0)
        model_left = cap - state.ws_model_used.get((ws.name, model), 0)
        left = model_left if left is None else min(left, model_left)
    return left


def beyond(ws: Workspace, req: Request) -> str:
    """Why the job can never fit its workspace quota, or ""."""
    if ws.quota_gpus is not None and req.need > ws.quota_gpus:
        return f"needs {req.need} GPUs; workspace {ws.name}'s whole quota is {ws.quota_gpus}"
    if ws.quota_by_model and all(ws.quota_by_model.get(m, 0) < req.need for m in req.models):
        caps = ", ".join(f"{m}: {ws.quota_by_model.get(m, 0)}" for m in req.models)
        return f"needs {req.need} GPUs; workspace {ws.name}'s quota per model is {caps}"
    return ""


def within(state: ClusterState, req: Request,
           reserved: Mapping[str, int]) -> tuple[Request | None, str]:
    """``req`` narrowed to the GPU models its workspace quota has room on,
    or None and the reason it has no room now."""
    ws = state.workspaces[req.job.workspace]
    left = room_for(state, ws, None, reserved)
    if left is not None and left < req.need:
        used = state.ws_used.get(ws.name, 0)
        return None, explain.quota(ws.name, used, ws.quota_gpus or 0, req.need,
                                   reserved=reserved.get(ws.name, 0))
    if not ws.quota_by_model:
        return req, ""
    models = tuple(m for m in req.models if (room_for(state, ws, m, {}) or 0) >= req.need)
    if models:
        return (req if models == req.models else replace(req, models=models)), ""
    m = req.models[0]
    used = state.ws_model_used.get((ws.name, m), 0)
    return None, explain.quota(ws.name, used, ws.quota_by_model.get(m, 0), req.need, m)


def short(state: ClusterState, req: Request, reserved: Mapping[str, int]) -> int:
    """GPUs the workspace must give back before ``req`` fits its quota
    (a lower bound when per-model quotas apply)."""
    ws = state.workspaces[req.job.workspace]
    left = room_for(state, ws, None, reserved)
    missing = 0 if left is None else max(0, req.need - left)
    if ws.quota_by_model:
        best = max((room_for(state, ws, m, {}) or 0) for m in req.models)
        missing = max(missing, req.need - best)
    return missing
