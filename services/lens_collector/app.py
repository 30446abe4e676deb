"""lens-collector shell: batch pull consumers on the control and telemetry
streams write rows into ClickHouse (acked only after the insert returned),
and a request-reply endpoint answers the named queries.

The clickhouse-connect client is synchronous and the in-process engine is not
meant for concurrent use, so every store call runs on one worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clickhouse_connect.driver.client import Client

from libs.bus import CONTROL, TELEMETRY, Bus
from libs.events import SUBJECT_ROOT, Event
from libs.logs import get_logger
from libs.settings import Settings
from libs.store import migrate, open_store
from services.lens_collector.queries import QueryError, resolve
from services.lens_collector.rows import COLUMNS, rows_for
from services.lens_collector.schema import MIGRATIONS

QUERY_SUBJECT = f"{SUBJECT_ROOT}.lens.query"


class LensCollector:
    name = "lens-collector"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = settings.clickhouse_database
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clickhouse")
        self.client: Client | None = None
        self.rows_written: dict[str, int] = {}
        self._log = get_logger()

    async def _store(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self, bus: Bus) -> None:
        self.client = await self._store(open_store, self.settings.store_dsn)
        applied = await self._store(migrate, self.client, self.db, MIGRATIONS)
        self._log.info("store ready", dsn=self.settings.store_dsn.split("@")[-1], applied=applied)
        for durable, stream, batch in (("lens-events", CONTROL, 256),
                                       ("lens-telemetry", TELEMETRY, 1024)):
            bus.consume(durable=durable, subjects=[s for s in stream.subjects], stream=stream,
                        batch_handler=self._write, batch=batch, ack_wait_s=60)
        await bus.serve(QUERY_SUBJECT, self._query, queue="lens")

    async def _write(self, batch: list[tuple[Event, int]]) -> None:
        tables = rows_for(batch)
        await self._store(self._insert, tables)

    def _insert(self, tables: dict[str, list[list[Any]]]) -> None:
        assert self.client is not None
        for table, rows in tables.items():
            # Same rows → same token: ClickHouse drops a redelivered batch.
            token = hashlib.sha256(
                "\n".join(str(r[COLUMNS[table].index("id" if table == "events" else "event_id")])
                          for r in rows).encode()
            ).hexdigest()
            self.client.insert(f"{self.db}.{table}", rows, column_names=COLUMNS[table],
                               settings={"insert_deduplication_token": f"{table}-{token}"})
            self.rows_written[table] = self.rows_written.get(table, 0) + len(rows)

    async def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            sql, params = resolve(str(request.get("query", "")), request.get("params") or {},
                                  self.db)
        except QueryError as exc:
            return {"ok": False, "error": str(exc)}
        result = await self._store(lambda: self.client.query(sql, parameters=params))
        return {"ok": True, "columns": list(result.column_names),
                "rows": [list(r) for r in result.result_rows]}

    async def stop(self) -> None:
        self._pool.shutdown(wait=True)

    def health(self) -> dict[str, Any]:
        return {"rows_written": self.rows_written}
