"""How the scheduler's records look in KV (JSON), and how bootstrap's node
records become the scheduler's node view."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from libs.events import JobSpec, WorkerSlot
from services.scheduler.view import JobRecord, NodeView


def job_to_json(job: JobRecord) -> dict[str, Any]:
    data = asdict(job)
    data["spec"] = job.spec.model_dump(mode="json")
    data["slots"] = [s.model_dump() for s in job.slots]
    data["exits"] = {str(k): v for k, v in job.exits.items()}
    data["updated_at"] = time.time()
    return data


def job_from_json(data: dict[str, Any]) -> JobRecord:
    data = dict(data)
    data.pop("updated_at", None)
    data["spec"] = JobSpec.model_validate(data["spec"])
    data["slots"] = [WorkerSlot.model_validate(s) for s in data["slots"]]
    data["exits"] = {int(k): v for k, v in data["exits"].items()}
    return JobRecord(**data)


def node_from_bootstrap(record: dict[str, Any]) -> NodeView:
    spec = record["spec"]
    labels = spec.get("labels", {})
    return NodeView(name=spec["name"], gpus=spec["gpu_count"], gpu_model=spec["gpu_model"],
                    ip=spec["ip"], rack=labels.get("rack", ""), switch=labels.get("switch", ""),
                    pool=labels.get("pool", "default"), state=record["state"])
