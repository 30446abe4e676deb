"""What every verb shares: the settings, and tables or JSON on stdout."""

from __future__ import annotations

import json
from typing import Any

from libs.settings import Settings


def load_settings() -> Settings:
    return Settings()


def print_rows(data: Any, as_json: bool, columns: list[str], title: str) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in data:
        table.add_row(*[_cell(row.get(c)) for c in columns])
    Console().print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        return json.dumps(value) if not isinstance(value, list) else ", ".join(map(str, value))
    return str(value)
