"""What every verb shares: the settings, and tables or JSON on stdout.

Tables look like kubectl's: upper-case headers, columns as wide as their
widest cell, nothing cut short (an id copied from a table must work, in a
pipe or an 80-column terminal alike). ``-o wide`` adds columns, ``-o name``
prints one id per line for ``xargs``, ``--json`` (or ``-o json``) one JSON
document; ``--watch`` redraws the table until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors

from cli.client import CliError, bus_failure
from libs.settings import Settings


def load_settings() -> Settings:
    return Settings()


def add_output_flags(parser: argparse.ArgumentParser, *, watch: bool = True) -> None:
    parser.add_argument("-o", "--output", choices=["wide", "name", "json"],
                        help="wide: more columns; name: one id per line; json: as --json")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    if watch:
        parser.add_argument("-w", "--watch", action="store_true",
                            help="redraw the table every --interval seconds until Ctrl-C")
        parser.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def time_ms(text: str | None, flag: str, now: datetime | None = None) -> int:
    """A time flag (``--since``, ``--until``) as epoch milliseconds: a
    duration back from now (30s, 10m, 2h, 7d, 4w) or a time (ISO 8601, UTC
    unless it says otherwise); 0 when not given."""
    if not text:
        return 0
    now = now or datetime.now(UTC)
    duration = _DURATION.match(text.strip())
    if duration:
        ago = timedelta(seconds=float(duration.group(1)) * _UNIT_S[duration.group(2)])
        return int((now - ago).timestamp() * 1000)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"{flag} {text!r}: write a duration (30s, 10m, 2h, 7d, 4w) or a time "
                       "(2026-12-01T12:00:00Z)") from None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned plain-text table; no cell is ever truncated."""
    header = [c.upper() for c in columns]
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(h), *(len(line[i]) for line in cells)]) for i, h in enumerate(header)]
    return "\n".join("   ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in [header, *cells])


def print_rows(data: Any, as_json: bool, columns: list[str], title: str, *,
               output: str | None = None, wide: Sequence[str] = (),
               name: str | None = None, heading: bool = False) -> None:
    """``data`` (a list of dicts) as the flags ask; ``name`` is the id column
    (default: the first); ``heading`` prints ``title`` above the table."""
    if as_json or output == "json":
        print(json.dumps(data, indent=2, default=str))
        return
    if output == "name":
        key = name or columns[0]
        for row in data:
            print(row.get(key))
        return
    if not data:
        print(f"No {title} found.", file=sys.stderr)
        return
    if heading:
        print(title)
    print(format_table(data, [*columns, *wide] if output == "wide" else columns))


def watch(render: Callable[[], str], interval_s: float) -> int:
    """Redraw ``render()`` until Ctrl-C: in place on a terminal, else only
    when it changed (so a pipe gets each new state once). A round that
    fails (the bus restarting) shows why in place of the table and the
    watch goes on, as ``watch kubectl get`` would."""
    shown = None
    tty = sys.stdout.isatty()
    try:
        while True:
            try:
                text = render()
            except (CliError, nats.errors.Error) as exc:
                why = bus_failure(exc) if isinstance(exc, nats.errors.Error) else str(exc)
                text = f"primus-safe: {why} (trying again every {interval_s:g} s)"
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
                sys.stdout.flush()
            elif text != shown:
                print(text + "\n", flush=True)
            shown = text
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value)
    return " ".join(str(value).split())  # one line per row
