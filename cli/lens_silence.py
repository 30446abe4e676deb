"""``primus-safe lens silence create|list|expire``: Alertmanager silences
for Lens alerts, through Alertmanager's v2 API (never the bus).

- ``lens silence create node=gpu-3 severity=~critical|warning --duration 2h
  --comment "replacing the GPU"``: prints the new silence's id;
- ``lens silence list [--all]``: id, state, matchers, end, author, comment;
- ``lens silence expire ID``.

A silenced alert is still stored by Lens, and not re-sent to that
Alertmanager while the silence lasts (README, "Alert delivery"). The
Alertmanager is ``--alertmanager URL``, else the first ``alertmanager``
receiver of the receivers file (PRIMUS_LENS_ALERT_RECEIVERS). Every verb
takes ``--json``; errors are one line.
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.client import CliError
from cli.output import format_table, load_settings

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TIMEOUT_S = 10.0


def add_parser(lsub: Any) -> None:
    p = lsub.add_parser("silence", help="Alertmanager silences of Lens alerts")
    p.add_argument("--alertmanager", metavar="URL", help="Alertmanager's base URL (default: "
                   "the first alertmanager receiver of PRIMUS_LENS_ALERT_RECEIVERS)")
    ssub = p.add_subparsers(dest="silence_verb", required=True)
    s = ssub.add_parser("create", help="silence the alerts that match every matcher")
    s.add_argument("matchers", nargs="+", metavar="MATCHER",
                   help="name=value, name!=value, name=~regex or name!~regex; labels: "
                        "alertname, severity, node, job, workspace, gpu, subject")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--duration", default=None, help="how long: 30m, 2h, 1d (default 2h)")
    when.add_argument("--until", default=None, help="until a time (ISO 8601, UTC by default)")
    s.add_argument("--comment", default=None, help="why (Alertmanager requires one)")
    s.add_argument("--author", default=None, help="who (default: user@host)")
    s.add_argument("--json", action="store_true")
    s = ssub.add_parser("list", help="silences: active and pending (--all: expired too)")
    s.add_argument("--all", action="store_true", help="expired ones too")
    s.add_argument("--json", action="store_true")
    s = ssub.add_parser("expire", help="end a silence now")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    for sub in ssub.choices.values():  # also accepted after the verb
        sub.add_argument("--alertmanager", metavar="URL", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)


def alertmanager_url(flag: str | None) -> str:
    """``--alertmanager``, else the receivers file's first Alertmanager."""
    if flag:
        if not re.match(r"^https?://[^/\s]+", flag):
            raise CliError(f"--alertmanager {flag!r}: write its base URL, e.g. "
                           "http://alertmanager:9093")
        return flag.rstrip("/")
    from libs.specs import load_model
    from services.lens_collector.delivery_config import DeliveryConfig

    path = load_settings().lens_alert_receivers
    if path is None:
        raise CliError("no Alertmanager: give --alertmanager URL or set "
                       "PRIMUS_LENS_ALERT_RECEIVERS to a receivers file with one")
    ams = load_model(path, DeliveryConfig).alertmanagers
    if not ams:
        raise CliError(f"{path} has no alertmanager receiver: give --alertmanager URL")
    return ams[0].url


def _call(base: str, method: str, path: str, body: Any = None) -> Any:
    """One v2 API call; a CliError (one line) when it fails."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}/api/v2/{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace").strip()
        try:
            message = json.loads(text)
            text = message if isinstance(message, str) else message.get("message", text)
        except (ValueError, AttributeError):
            pass
        raise CliError(f"alertmanager at {base} refused {method} {path}: HTTP {exc.code}: "
                       f"{' '.join(str(text).split())[:300]}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"alertmanager at {base} is unreachable ({reason})") from None
    return json.loads(raw) if raw.strip() else None


def _until(args: argparse.Namespace, now: datetime) -> datetime:
    if args.until:
        try:
            when = datetime.fromisoformat(args.until.strip().replace("Z", "+00:00"))
        except ValueError:
            raise CliError(f"--until {args.until!r}: write a time such as "
                           "2026-12-01T12:00:00Z") from None
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
        if when <= now:
            raise CliError(f"--until {args.until}: that is not in the future")
        return when
    text = args.duration or "2h"
    m = _DURATION.match(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise CliError(f"--duration {text!r}: write a duration such as 30m, 2h or 1d")
    return now + timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])


def create(base: str, args: argparse.Namespace) -> dict[str, Any]:
    from services.lens_collector.delivery_config import parse_matcher

    try:
        matchers = [parse_matcher(m) for m in args.matchers]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    now = datetime.now(UTC)
    ends = _until(args, now)
    author = args.author or f"{getpass.getuser()}@{socket.gethostname()}"
    body = {"matchers": [{"name": m.name, "value": m.value, "isRegex": m.is_regex,
                          "isEqual": m.is_equal} for m in matchers],
            "startsAt": now.isoformat(), "endsAt": ends.isoformat(), "createdBy": author,
            "comment": args.comment or f"silenced with primus-safe by {author}"}
    reply = _call(base, "POST", "silences", body)
    return {"id": reply["silenceID"], "matchers": [str(m) for m in matchers],
            "ends": ends.isoformat(timespec="seconds"), "comment": body["comment"]}


def listing(base: str, every: bool) -> list[dict[str, Any]]:
    rows = []
    for s in _call(base, "GET", "silences") or []:
        state = (s.get("status") or {}).get("state", "")
        if state == "expired" and not every:
            continue
        rows.append({"id": s.get("id", ""), "state": state,
                     "matchers": " ".join(_matcher_text(m) for m in s.get("matchers", [])),
                     "ends": s.get("endsAt", ""), "author": s.get("createdBy", ""),
                     "comment": s.get("comment", "")})
    order = {"active": 0, "pending": 1, "expired": 2}
    return sorted(rows, key=lambda r: (order.get(r["state"], 3), r["ends"], r["id"]))


def _matcher_text(m: dict[str, Any]) -> str:
    op = {(False, True): "=", (False, False): "!=", (True, True): "=~",
          (True, False): "!~"}[(bool(m.get("isRegex")), bool(m.get("isEqual", True)))]
    return f"{m.get('name')}{op}{m.get('value')}"


def run(args: argparse.Namespace) -> int:
    base = alertmanager_url(getattr(args, "alertmanager", None))
    verb = args.silence_verb
    if verb == "create":
        doc: Any = create(base, args)
        print(json.dumps(doc, indent=2) if args.json else doc["id"])
    elif verb == "list":
        rows = listing(base, args.all)
        if args.json:
            print(json.dumps(rows, indent=2))
        elif rows:
            print(format_table(rows, ["id", "state", "matchers", "ends", "author", "comment"]))
        else:
            print("no silences" + ("" if args.all else " (active or pending; --all for expired)"))
    else:
        _call(base, "DELETE", f"silence/{urllib.parse.quote(args.id, safe='')}")
        print(json.dumps({"id": args.id, "expired": True}) if args.json
              else f"silence {args.id} expired")
    return 0
