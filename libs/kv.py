"""Writes to the state buckets (libs.bus.KV_BUCKETS).

Each bucket has one writer service, yet two replicas of it can overlap for a
moment (a leader handing over, a restart while the old process drains). A
write therefore names the revision it read: if someone wrote in between, the
update is refused (``KeyWrongLastSequenceError``) instead of silently
overwriting the newer record.
"""

from __future__ import annotations

import json
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue


async def put_record(kv: KeyValue, key: str, record: dict[str, Any]) -> int:
    """Store ``record`` as JSON under ``key`` over the revision read just
    before (or as a new key); the new revision."""
    value = json.dumps(record).encode()
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return await kv.create(key, value)
    return await kv.update(key, value, last=entry.revision)
