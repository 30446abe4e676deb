"""Every route table side by side, and what is derived from them.

The five services' tables (``services/<name>/routes.py``), the operator
CLI's (``cli/routes.py``) and the training workers' (``libs/sdk.py``) are
collected here, and from them, never by hand: the NATS users the Helm chart
ships (``libs.nats_permissions``), ``proto/`` with its AsyncAPI operations
(``libs.proto_gen``), and the README's Architecture table. It lives with
the CLI, the one layer that may import every service; it only reads their
tables. The same step writes the chart's values schema for the services'
configuration files from their models (``cli.chart_schema``).

    python -m cli.catalog --write   # regenerate all of them
    python -m cli.catalog --check   # exit 1 when one of them drifted
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli import chart_schema
from cli.routes import ROUTES as CLI
from libs import sdk
from libs.events import EVENT_TYPES, Event, event_type_name
from libs.nats_permissions import CHART_FILE, HEADER, render_callout, render_users
from libs.proto_gen import render
from libs.routes import Routes, events_of
from libs.topology import STREAMS
from services.bench.routes import AGENT, COORDINATOR
from services.bootstrap.routes import ROUTES as BOOTSTRAP
from services.failover.routes import ROUTES as FAILOVER
from services.lens_collector.routes import ROUTES as LENS
from services.scheduler.routes import ROUTES as SCHEDULER

SERVICES: tuple[Routes, ...] = (BOOTSTRAP, SCHEDULER, AGENT, COORDINATOR, LENS, FAILOVER)
# Every route table: the services, the operator's CLI, training workers.
ROLES: tuple[Routes, ...] = (*SERVICES, CLI, sdk.ROUTES)
ROLE_NAMES: tuple[str, ...] = tuple(r.service for r in ROLES)
# The platform's NATS users (jobs log in with their own credential instead).
NATS_USERS: tuple[str, ...] = tuple(r.service for r in ROLES if r.nats_user)

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "proto"
README = ROOT / "README.md"
BEGIN, END = "<!-- routes:begin -->", "<!-- routes:end -->"


def role(name: str) -> Routes:
    for r in ROLES:
        if r.service == name:
            return r
    raise KeyError(f"no route table {name!r}; known: {', '.join(ROLE_NAMES)}")


# --------------------------------------------------------------------------- the README table


def _events(events: tuple[type[Event], ...]) -> str:
    """Event names, or "every X event" when they are all of a stream's."""
    names = [event_type_name(e) for e in events]
    for stream in STREAMS:
        every = events_of(stream, EVENT_TYPES)
        if every and set(events) == set(every):
            return f"every {stream.name} event"
    return ", ".join(f"`{n}`" for n in names) or "–"


def _cell(items: list[str]) -> str:
    return "<br>".join(items) or "–"


def architecture_table(tables: tuple[Routes, ...] = SERVICES) -> str:
    """The services' route tables as one Markdown table: a column each."""
    rows: dict[str, list[str]] = {
        "hears (durable: events)": [], "says": [], "keeps": [], "reads": [],
        "answers": [], "asks": [], "leads": []}
    for t in tables:
        rows["hears (durable: events)"].append(_cell([
            f"{c.durable}{' (leader)' if c.leader else ''}: {_events(c.events)}"
            for c in t.consumes]))
        rows["says"].append(_events(t.publishes))
        rows["keeps"].append(_cell([f"`{b.name}`" for b in t.owns]))
        rows["reads"].append(_cell([f"`{b.name}`" for b in t.reads]
                                   + [f"`{event_type_name(e)}` (last)" for e in t.rereads]))
        rows["answers"].append(_cell([f"`{s.endpoint.subject}`" for s in t.serves]))
        rows["asks"].append(_cell([f"`{e.subject}`" for e in t.calls]))
        rows["leads"].append(_cell([f"`{lease}`" for lease in t.leases]))
    head = "| | " + " | ".join(f"**{t.service}**" for t in tables) + " |"
    rule = "|---" * (len(tables) + 1) + "|"
    body = [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    note = ("Generated from `services/*/routes.py` by `python -m cli.catalog --write`; "
            "a test fails when it drifts. Every service also answers "
            "`safe.health.<service>` and may ship its log lines (`log.record`).")
    return "\n".join([head, rule, *body, "", note]) + "\n"


def readme_with_table(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + architecture_table() + text[end:]


# --------------------------------------------------------------------------- writing


def generated() -> dict[Path, str]:
    """Every derived file and its content."""
    files = {PROTO / rel: text for rel, text in render(ROLES).items()}
    files[CHART_FILE] = HEADER + render_users(ROLES) + render_callout(ROLES)
    files[README] = readme_with_table(README.read_text())
    files[chart_schema.SCHEMA_FILE] = chart_schema.render(chart_schema.SCHEMA_FILE.read_text())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the derived files")
    parser.add_argument("--check", action="store_true", help="exit 1 when one drifted")
    args = parser.parse_args(argv)
    files = generated()
    if args.write:
        (PROTO / "schemas").mkdir(parents=True, exist_ok=True)
        for stale in (PROTO / "schemas").glob("*.json"):
            if stale not in files:
                stale.unlink()
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        print(f"wrote {len(files)} files", file=sys.stderr)
        return 0
    drifted = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in drifted:
            print(f"{path.relative_to(ROOT)} is out of date: run python -m cli.catalog "
                  "--write", file=sys.stderr)
        return 1 if drifted else 0
    print(architecture_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
