"""The request/reply endpoint lens-collector answers: a named query over
ClickHouse (``queries.QUERIES``) with typed parameters, never SQL. Shared by
the service and the CLI's ``lens`` verbs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from libs.routes import Endpoint, Reply, query


class LensQuery(BaseModel):
    query: str = Field(description="the name of a query (services/lens_collector/queries.py)")
    params: dict[str, Any] = Field(default_factory=dict)


class LensRows(Reply):
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)


LENS_QUERY = Endpoint(query("lens.query"), LensQuery, LensRows,
                      "a named query over the telemetry and history in ClickHouse")
