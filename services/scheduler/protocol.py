"""The request-reply subject the scheduler leader answers, shared by the
service and ``primus-safe submit``.

Why request-reply before the event: a job that can never run must be
refused before the CLI prints a job id, and only the scheduler knows its
workspaces, pools and registered nodes. The subject lives under
``safe.query.*``, outside every stream; the scheduler checks the job again
when it reads ``job.submitted`` (events may come from elsewhere).
"""

from __future__ import annotations

from libs.bus import QUERY_SUBJECT

# {"spec": <JobSpec as JSON>}
#   -> {"ok": true, "verdict": "ok" | "refused" | "unschedulable", "reason", "field"}
ADMISSION_SUBJECT = QUERY_SUBJECT.format(name="scheduler.admission")
