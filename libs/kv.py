"""Typed reads and revision-checked writes of the state buckets
(``libs.records``).

Each bucket has one writer service, yet two replicas of it can overlap for a
moment (a leader handing over, a restart while the old process drains). A
write therefore names the revision its writer last saw of that key: if
someone wrote in between, the write is refused with ``RecordConflict``
instead of silently overwriting the newer record, and the writer decides
(the scheduler steps down when a newer term wrote; others take the stored
revision and write again, logged).

Reading a whole bucket is ``Records.load``; a record that does not parse,
or is of a newer version, is skipped and named in ``Records.unreadable``
rather than failing every reader of the bucket.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic

from nats.aio.client import Client
from nats.js.errors import (
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue
from pydantic import ValidationError

from libs.logs import get_logger
from libs.records import BucketSpec, R, UnsupportedRecord

# Upgrades a stored document (as JSON) to the model's current version.
Upgrade = Callable[[str, dict[str, Any]], dict[str, Any]]


class RecordConflict(RuntimeError):
    """Someone else wrote the key since this writer last read or wrote it."""

    def __init__(self, bucket: str, key: str, current: Any) -> None:
        super().__init__(f"{bucket}/{key} was written by someone else since we last saw it")
        self.key = key
        self.current = current  # the stored record now (None: deleted), or what failed to parse


class Records(Generic[R]):
    """One bucket, read and written as ``model`` records.

    The revision of each key this process read or wrote is remembered; a
    write is made at that revision (or as a new key)."""

    def __init__(self, kv: KeyValue, spec: BucketSpec[R], nc: Client) -> None:
        self.kv = kv
        self.nc = nc
        self.spec = spec
        self.model = spec.record
        self._revisions: dict[str, int] = {}
        self.unreadable: dict[str, str] = {}  # key -> why it was skipped

    def parse(self, key: str, value: bytes | None) -> R:
        """One stored value as a record (raises ValueError with the reason)."""
        upgrade: Upgrade | None = getattr(self.model, "upgrade", None)
        try:
            doc = json.loads(value or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            self.model.check_version(doc.get("version", 1))
            if upgrade is not None:
                doc = upgrade(key, doc)
            return self.model.model_validate(doc, context={"stored": True})
        except UnsupportedRecord as exc:
            raise UnsupportedRecord(f"{self.spec.name}/{key}: {exc}") from None
        except (ValidationError, ValueError, RecursionError) as exc:
            raise ValueError(f"{self.spec.name}/{key}: not a {self.model.__name__}: "
                             f"{_short(exc)}") from None

    async def keys(self) -> list[str]:
        """Every key with an entry in the bucket (its last may be a delete:
        ``get`` says None for those). Read from the stream's subject list,
        a page of up to 100,000 per request, not with nats-py's
        ``KeyValue.keys``: that opens a consumer per call, which lingers for
        minutes (a stream takes 1,000), and it can answer "no keys" for a
        full bucket when the consumer has sent every entry before the
        client looks at its count (a new scheduler leader would then
        rebuild with no jobs)."""
        prefix = f"$KV.{self.spec.name}."
        keys: list[str] = []
        while True:
            body = json.dumps({"subjects_filter": f"{prefix}>", "offset": len(keys)})
            reply = await self.nc.request(f"$JS.API.STREAM.INFO.KV_{self.spec.name}",
                                          body.encode(), timeout=5.0)
            doc = json.loads(reply.data)
            if "error" in doc:
                raise RuntimeError(f"cannot list the keys of {self.spec.name}: "
                                   f"{doc['error'].get('description', doc['error'])}")
            page = list((doc.get("state") or {}).get("subjects") or {})
            keys += [subject.removeprefix(prefix) for subject in page]
            if not page or len(keys) >= int(doc.get("total") or 0):
                return sorted(keys)

    async def get(self, key: str) -> R | None:
        """The stored record, or None when there is none; raises ValueError
        for a record this release cannot read."""
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            self._revisions.pop(key, None)
            return None
        if entry.revision is not None:
            self._revisions[key] = entry.revision
        return self.parse(key, entry.value)

    async def load(self) -> dict[str, R]:
        """Every record, by key. Unreadable ones are skipped, each named in
        ``unreadable`` with why (and logged)."""
        out: dict[str, R] = {}
        self.unreadable = {}
        for key in await self.keys():
            try:
                record = await self.get(key)
            except ValueError as exc:  # UnsupportedRecord included
                self.unreadable[key] = str(exc)
                get_logger(component="kv").warning("record skipped", bucket=self.spec.name,
                                                   key=key, error=str(exc))
                continue
            if record is not None:
                out[key] = record
        return out

    async def put(self, key: str, record: R, *,
                  on_conflict: Callable[[R | None], Awaitable[None] | None] | None = None
                  ) -> int:
        """Store ``record`` at the revision last seen of ``key`` (or as a new
        key); the new revision. If someone wrote since, ``on_conflict`` is
        given the stored record (None: gone): it may raise to give up, else
        the write is made again over the stored revision. Without it the
        conflict raises ``RecordConflict``."""
        value = record.model_dump_json().encode()
        try:
            return await self._write(key, value, self._revisions.get(key))
        except KeyWrongLastSequenceError:  # also create()'s answer when the key exists
            pass
        try:
            current = await self.get(key)
        except ValueError as exc:
            current = None
            if on_conflict is None:
                raise RecordConflict(self.spec.name, key, str(exc)) from None
        if on_conflict is None:
            raise RecordConflict(self.spec.name, key, current)
        outcome = on_conflict(current)
        if outcome is not None:
            await outcome
        get_logger(component="kv").warning("record written by someone else since we saw it; "
                                           "writing ours over it", bucket=self.spec.name, key=key)
        return await self._write(key, value, self._revisions.get(key))

    async def _write(self, key: str, value: bytes, revision: int | None) -> int:
        if revision is None:
            new = await self.kv.create(key, value)
        else:
            new = await self.kv.update(key, value, last=revision)
        self._revisions[key] = new
        return new

    async def delete(self, key: str) -> None:
        await self.kv.delete(key)
        self._revisions.pop(key, None)


def _short(exc: BaseException) -> str:
    return str(exc).replace("\n", "; ")[:300]
