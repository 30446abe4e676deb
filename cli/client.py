"""How operator verbs reach the platform: a bus connection found from the
environment (PRIMUS_NATS_URL) or from the embedded stack's ``stack.json``,
plus reads of the owners' KV buckets and Lens's named queries."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from nats.js.errors import BucketNotFoundError, NoKeysError

from libs.bus import Bus
from libs.embedded import STACK_FILE
from libs.events import JobSpec, JobSubmitted, JobSubmittedData, check_key
from libs.settings import Settings
from libs.specs import load_model

LENS_QUERY_SUBJECT = "safe.lens.query"


class CliError(Exception):
    """An error for the operator: printed without a traceback, exit 1."""


def bus_target(settings: Settings) -> tuple[str, str | None]:
    if "PRIMUS_NATS_URL" not in os.environ:
        stack = Path(settings.state_dir) / STACK_FILE
        if stack.exists():
            info = json.loads(stack.read_text())
            return info["nats_url"], info.get("nats_token")
    return settings.nats_url, settings.nats_token


async def connect(settings: Settings) -> Bus:
    url, token = bus_target(settings)
    try:
        return await Bus.connect(
            url, "cli", token=token, **settings.nats_auth)
    except ConnectionError as exc:
        raise CliError(f"{exc}") from None


async def read_bucket(bus: Bus, bucket: str, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    try:
        kv = await bus.kv(bucket)
        keys = await kv.keys()
    except NoKeysError:
        return []
    except BucketNotFoundError:
        if missing_ok:
            return []
        raise CliError(f"no {bucket!r} bucket on this bus: no platform service has run here; "
                       "start one with `primus-safe up`") from None
    except Exception as exc:
        raise CliError(f"cannot read the {bucket!r} bucket: {exc}; is the platform up?") from None
    records = []
    for key in sorted(keys):
        records.append(json.loads((await kv.get(key)).value))
    return records


async def lens_query(bus: Bus, name: str, **params: Any) -> list[dict[str, Any]]:
    try:
        reply = await bus.request(LENS_QUERY_SUBJECT, {"query": name, "params": params},
                                  timeout_s=15)
    except Exception as exc:
        raise CliError(f"lens-collector did not answer ({exc!r}); is it running?") from None
    if not reply.get("ok"):
        raise CliError(f"lens query {name!r} failed: {reply.get('error')}")
    return [dict(zip(reply["columns"], row, strict=True)) for row in reply["rows"]]


async def submit(path: str) -> str:
    """Validate a job file and queue it; returns the new job id."""
    spec = load_model(path, JobSpec)
    if spec.workdir is None:
        spec = spec.model_copy(update={"workdir": str(Path.cwd())})
    job = f"{check_key(spec.name, 'job name')[:40]}-{uuid.uuid4().hex[:6]}"
    bus = await connect(Settings())
    try:
        # Ask the scheduler leader first, so a job that can never run is
        # refused before it has an id; without an answer the job goes anyway
        # (the scheduler checks it again when it reads job.submitted).
        import re
        import sys

        from services.scheduler.protocol import ADMISSION_SUBJECT
        try:
            answer = await bus.request(ADMISSION_SUBJECT, {"spec": spec.model_dump(mode="json")},
                                       timeout_s=2.0)
        except Exception:
            answer = {}
            print("primus-safe submit: no scheduler answered within 2 s; submitting anyway "
                  "(the scheduler checks the job when it reads it)", file=sys.stderr)
        if answer.get("ok") is False:
            print(f"primus-safe submit: the scheduler could not check the job "
                  f"({answer.get('error')}); submitting anyway", file=sys.stderr)
        reason = answer.get("reason") or ""
        if answer.get("verdict") == "refused":
            field = answer.get("field") or ""
            where = f"field {field} (not set in the file): " if field else ""
            text = Path(path).read_text(errors="replace").splitlines()
            for number, line in enumerate(text, 1):
                if field and re.match(rf"\s*{re.escape(field)}\s*:", line):
                    where = f"line {number}, field {field}: "
                    break
            raise CliError(f"{path}: {where}refused: {reason}")
        if answer.get("verdict") == "unschedulable":
            print(f"primus-safe submit: accepted as unschedulable: {reason}; it waits for the "
                  f"cluster to grow and does not hold up the jobs behind it", file=sys.stderr)
        await bus.publish(JobSubmitted(source="cli", job=job, data=JobSubmittedData(spec=spec)))
    finally:
        await bus.close()
    return job
