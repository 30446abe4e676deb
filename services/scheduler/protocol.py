"""The request/reply endpoint the scheduler leader answers, shared by the
service and ``primus-safe submit``.

Why request-reply before the event: a job that can never run must be
refused before the CLI prints a job id, and only the scheduler knows its
workspaces, pools and registered nodes. The subject lives under
``safe.query.*``, outside every stream; the scheduler checks the job again
when it reads ``job.submitted`` (events may come from elsewhere).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from libs.events import JobSpec
from libs.routes import Endpoint, Reply, query


class AdmissionRequest(BaseModel):
    spec: JobSpec


class AdmissionReply(Reply):
    verdict: Literal["ok", "refused", "unschedulable"]
    reason: str = ""
    field: str | None = None  # the job file's field that makes it unrunnable
    warnings: list[str] = []  # accepted, but the submitter should know (no shared checkpoints)
    driver: str = ""  # where workers run: "kubernetes" paths in the job file are the image's


ADMISSION = Endpoint(query("scheduler.admission"), AdmissionRequest, AdmissionReply,
                     "can this job ever run on the registered nodes? (asked before submit)")
