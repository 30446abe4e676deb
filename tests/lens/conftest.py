"""Fixtures of the Lens tests that use the engine directly: a client of the
session's chDB (``clickhouse_dsn``) and a migrated database of the test's own."""

from __future__ import annotations

from typing import Any

import pytest

from libs.store import migrate, open_store
from services.lens_collector.schema import MIGRATIONS


@pytest.fixture(scope="module")
def client(clickhouse_dsn: str) -> Any:
    return open_store(clickhouse_dsn)


@pytest.fixture
def db(client: Any, database: str) -> str:
    migrate(client, database, MIGRATIONS)
    return database
