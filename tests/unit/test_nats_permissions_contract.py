"""The NATS permission table against the services: a service that starts to
publish an event its user may not publish, or declares a consumer the table
does not know, fails here before it fails on a secured server."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from libs.events import EVENT_TYPES, JobPlaced
from libs.nats_permissions import (
    ANY_DURABLE,
    CHART_FILE,
    HEADER,
    ROLE_NAMES,
    ROLES,
    event_subject,
    permissions,
    render_users,
    role,
)
from tests.helpers import subject_matches

REPO = Path(__file__).resolve().parents[2]
EVENT_NAMES = {cls.__name__ for cls in EVENT_TYPES}

# Which role's user runs the code in each file. Cluster drivers run inside
# the scheduler; libs/logs.py ships log lines from every service.
ROLE_FILES: dict[str, tuple[str, ...]] = {
    "bootstrap": ("services/bootstrap/*.py", "libs/logs.py"),
    "scheduler": ("services/scheduler/**/*.py", "libs/drivers/*.py", "libs/logs.py"),
    "bench-agent": ("services/bench/agent.py", "libs/logs.py"),
    "bench-coordinator": ("services/bench/coordinator.py", "services/bench/multinode.py",
                          "services/bench/sweep.py", "libs/logs.py"),
    "lens-collector": ("services/lens_collector/*.py", "libs/logs.py"),
    "failover": ("services/failover/*.py", "libs/logs.py"),
    "cli": ("cli/*.py", "services/bootstrap/handover.py"),
    "trainer": ("libs/sdk.py",),
}
# Client sides kept in a service's folder but run by the operator's CLI.
CLIENT_SIDE = {REPO / "services/bootstrap/handover.py"}


def _files(patterns: tuple[str, ...]) -> list[Path]:
    found = {p for pattern in patterns for p in REPO.glob(pattern)}
    explicit = {REPO / pattern for pattern in patterns}
    return sorted(p for p in found if p not in CLIENT_SIDE or p in explicit)


def _constructed_events(path: Path) -> set[str]:
    """Event classes the file builds (building one is how code publishes it)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in EVENT_NAMES:
                found.add(name)
    return found


def _consumers(path: Path) -> list[tuple[str, tuple[str, ...] | None]]:
    """(durable, literal subjects or None) of every consume/consume_raw call."""
    out: list[tuple[str, tuple[str, ...] | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) in ("consume", "consume_raw")):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        durable_node = kw["durable"]
        durable = (durable_node.value if isinstance(durable_node, ast.Constant) else ANY_DURABLE)
        subjects_node = kw.get("subjects")
        subjects = None
        if isinstance(subjects_node, ast.List) and all(
                isinstance(e, ast.Constant) for e in subjects_node.elts):
            subjects = tuple(e.value for e in subjects_node.elts)  # type: ignore[attr-defined]
        out.append((durable, subjects))
    return out


def test_every_role_has_its_files() -> None:
    assert set(ROLE_FILES) == set(ROLE_NAMES)
    for name, patterns in ROLE_FILES.items():
        assert _files(patterns), f"{name}: {patterns} match no file"


@pytest.mark.parametrize("name", ROLE_NAMES)
def test_a_service_publishes_only_what_its_user_may(name: str) -> None:
    allowed = {cls.__name__ for cls in role(name).produces}
    for path in _files(ROLE_FILES[name]):
        extra = _constructed_events(path) - allowed
        assert not extra, (
            f"{path.relative_to(REPO)} publishes {sorted(extra)} but the NATS user {name!r} "
            "may not: add them to its produces in libs/nats_permissions.py ROLES "
            "(and run python -m libs.nats_permissions --write)")


def test_every_file_that_publishes_events_belongs_to_a_role() -> None:
    covered = {p for patterns in ROLE_FILES.values() for p in _files(patterns)}
    for path in _files(("services/**/*.py", "cli/*.py", "libs/**/*.py")):
        if _constructed_events(path) and path not in covered:
            pytest.fail(f"{path.relative_to(REPO)} publishes events but no NATS role runs it: "
                        "add it to ROLE_FILES and the role's produces")


@pytest.mark.parametrize("name", ROLE_NAMES)
def test_every_consumer_a_service_declares_is_in_the_table(name: str) -> None:
    table = {c.durable: c for c in role(name).consumes}
    seen = set()
    for path in _files(ROLE_FILES[name]):
        for durable, subjects in _consumers(path):
            assert durable in table, (
                f"{path.relative_to(REPO)} declares consumer {durable!r}, which the NATS user "
                f"{name!r} may not create: add it to its consumes in libs/nats_permissions.py")
            seen.add(durable)
            if subjects is not None and durable != ANY_DURABLE:
                assert set(subjects) == set(table[durable].subjects), (durable, subjects)
    assert seen == set(table), f"{name}: table consumers no service declares: {set(table) - seen}"


def _lease_roles(path: Path) -> set[str]:
    """Roles the file campaigns for (LeaderElection(bus, "<role>", ...))."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LeaderElection"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            found.add(node.args[1].value)
    return found


@pytest.mark.parametrize("name", ROLE_NAMES)
def test_a_service_campaigns_only_for_its_own_lease(name: str) -> None:
    for path in _files(ROLE_FILES[name]):
        extra = _lease_roles(path) - set(role(name).leases)
        assert not extra, (f"{path.relative_to(REPO)} campaigns for {sorted(extra)}: add them to "
                           f"the leases of {name!r} in libs/nats_permissions.py ROLES")




def _subject_value(node: ast.expr, module: object) -> str | None:
    """The subject a call passes, when the code names it plainly: a module
    constant, ``CONSTANT.format(key=...)`` or an f-string (keys become ``*``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        value = getattr(module, node.id, None)
        return value if isinstance(value, str) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format" and isinstance(node.func.value, ast.Name)):
        template = getattr(module, node.func.value.id, None)
        if isinstance(template, str):
            return template.format(**{k.arg: "*" for k in node.keywords if k.arg})
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    return None


def _core_calls(path: Path) -> list[tuple[str, str]]:
    """(serve|subscribe|request|publish, subject) of every core-NATS call it can resolve."""
    module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            verb = node.func.attr
            on_nc = getattr(node.func.value, "attr", None) == "nc"
            if verb in ("serve", "request") or (on_nc and verb in ("subscribe", "publish")):
                subject = _subject_value(node.args[0], module)
                if subject is not None and subject.startswith(("safe.", "_INBOX")):
                    found.append((verb, subject))
    return found


@pytest.mark.parametrize("name", ROLE_NAMES)
def test_core_subjects_a_service_uses_are_allowed(name: str) -> None:
    p = permissions(role(name))
    for path in _files(ROLE_FILES[name]):
        for verb, subject in _core_calls(path):
            allowed = p.subscribe_allow if verb in ("serve", "subscribe") else p.publish_allow
            assert any(subject_matches(a, subject) for a in allowed), (
                f"{path.relative_to(REPO)} {verb}s {subject!r} but the NATS user {name!r} may "
                "not: add it to its serves/listens/calls in libs/nats_permissions.py ROLES")


def test_subject_matching() -> None:
    assert subject_matches("safe.query.bench.share.*", "safe.query.bench.share.*")
    assert subject_matches("safe.query.>", "safe.query.bench.pair")
    assert not subject_matches("safe.query.bench.pair", "safe.query.bench.*")
    assert not subject_matches("safe.health.x", "safe.health.x.n1")


def test_the_agent_cannot_touch_other_consumers_or_job_subjects() -> None:
    p = permissions(role("bench-agent"))
    assert event_subject(JobPlaced) not in p.publish_allow
    assert "$KV.jobs.>" not in p.publish_allow
    assert "$JS.API.CONSUMER.MSG.NEXT.CONTROL.scheduler" in p.publish_deny
    # Nobody may delete or purge a stream.
    for r in ROLES:
        for subject in permissions(r).publish_allow:
            assert ".DELETE." not in subject or subject.startswith("$JS.API.CONSUMER.DELETE.KV_")
            assert "PURGE" not in subject and subject not in (">", "$JS.>", "$JS.API.>")


def test_the_chart_ships_the_current_users() -> None:
    assert CHART_FILE.read_text() == HEADER + render_users(), (
        f"{CHART_FILE.relative_to(REPO)} is out of date: run python -m libs.nats_permissions "
        "--write")
