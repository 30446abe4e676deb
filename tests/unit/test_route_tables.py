"""The route tables against what is derived from them and against the
services: a handler without its route entry (or the reverse), a permission
or an AsyncAPI operation without its entry (or the reverse), and a chart,
``proto/`` or README table that drifted all fail here."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from typing import Any

import pytest

from cli.catalog import (
    README,
    ROLE_NAMES,
    ROLES,
    SERVICES,
    architecture_table,
    readme_with_table,
    role,
)
from libs.events import JobPlaced, JobSubmitted
from libs.nats_permissions import (
    CHART_FILE,
    HEADER,
    INBOX,
    permissions,
    render_callout,
    render_users,
)
from libs.proto_gen import operations
from libs.routes import Consumer, On, Routes, Serve
from libs.topology import CONTROL
from libs.wiring import RouteMismatch, bind
from services.bench.agent import BenchAgent
from services.bench.coordinator import BenchCoordinator
from services.bootstrap.app import Bootstrap
from services.failover.app import Failover
from services.lens_collector.app import LensCollector
from services.scheduler.app import Scheduler
from services.scheduler.protocol import ADMISSION
from tests.helpers import ROOT

CLASSES: dict[str, type] = {"bootstrap": Bootstrap, "scheduler": Scheduler,
                            "bench-agent": BenchAgent, "bench-coordinator": BenchCoordinator,
                            "lens-collector": LensCollector, "failover": Failover}


def test_every_service_has_a_table_and_its_class_carries_it() -> None:
    assert set(CLASSES) == {t.service for t in SERVICES}
    for name, cls in CLASSES.items():
        assert cls.routes is role(name) and cls.name == name  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(CLASSES))
def test_every_handler_has_its_route_entry_and_every_entry_its_handler(name: str) -> None:
    cls = CLASSES[name]
    table = role(name)
    methods = {n for n, f in inspect.getmembers(cls, inspect.isfunction) if n.startswith("on_")}
    assert methods == set(table.handlers), (
        f"{cls.__name__}: handlers without a route entry: {sorted(methods - set(table.handlers))}"
        f"; route entries without a handler: {sorted(set(table.handlers) - methods)}")
    assert set(bind(table, cls)) == methods  # each takes what its route brings


def test_a_table_naming_a_missing_or_mistyped_handler_is_refused() -> None:
    class Service:
        async def on_submitted(self, event: JobPlaced) -> None: ...

        async def on_admission(self, request: dict[str, Any]) -> dict[str, Any]: ...

    consumer = Consumer("t", CONTROL, (On(JobSubmitted, "on_submitted"),))
    with pytest.raises(RouteMismatch, match="takes .*JobPlaced.* bring job.submitted"):
        bind(Routes("t", "test", consumes=(consumer,)), Service)
    with pytest.raises(RouteMismatch, match="request is AdmissionRequest"):
        bind(Routes("t", "test", serves=(Serve(ADMISSION, "on_admission"),)), Service)
    missing = Consumer("t", CONTROL, (On(JobPlaced, "on_placed"),))
    with pytest.raises(RouteMismatch, match="no async method of that name"):
        bind(Routes("t", "test", consumes=(missing,)), Service)
    with pytest.raises(ValueError, match="named on_<what>"):
        Routes("t", "test", consumes=(Consumer("t", CONTROL, (On(JobPlaced, "handle"),)),))


# --------------------------------------------------------------------------- permissions

FIELDS = ("publishes", "owns", "reads", "calls", "listens", "rereads", "leases", "serves",
          "consumes")


def _entries(t: Routes) -> list[tuple[str, str, Routes]]:
    """Every entry of a table: its field, its name, and the table without it."""
    out = []
    for field in FIELDS:
        items = getattr(t, field)
        for i in range(len(items)):
            out.append((field, f"{field}[{i}]", replace(t, **{field: items[:i] + items[i + 1:]})))
    return out


def _subjects(t: Routes) -> set[tuple[str, str]]:
    p = permissions(t, ROLES)
    return ({("pub", s) for s in p.publish_allow} | {("sub", s) for s in p.subscribe_allow}
            | {("deny", s) for s in p.publish_deny})


def _infrastructure(t: Routes) -> set[tuple[str, str]]:
    """What every user gets whatever its table holds: replies, and for a
    service its topology and health."""
    bare = replace(t, publishes=(), owns=(), reads=(), calls=(), listens=(), leases=(),
                   serves=(), consumes=())
    return _subjects(bare) | {("sub", INBOX)}


@pytest.mark.parametrize("name", ROLE_NAMES)
def test_every_route_entry_has_its_permission_and_every_permission_its_entry(name: str) -> None:
    table = role(name)
    full = _subjects(table)
    given_by: dict[tuple[str, str], list[str]] = {}
    # What several entries of one kind give together (the dead-letter subject
    # of a service with two consumers) goes with the last of them.
    by_field = {f: full - _subjects(replace(table, **{f: ()})) for f in FIELDS}
    for field, entry, without in _entries(table):
        lost = full - _subjects(without)
        assert lost or by_field[field], f"{name}: {entry} gives its NATS user no permission"
        for subject in lost:
            given_by.setdefault(subject, []).append(entry)
    shared = set().union(*by_field.values())
    orphans = full - set(given_by) - shared - _infrastructure(table)
    assert not orphans, f"{name}: permissions no route entry explains: {sorted(orphans)}"


def test_the_agent_cannot_touch_other_consumers_or_job_subjects() -> None:
    p = permissions(role("bench-agent"), ROLES)
    assert "safe.job.*.placed" not in p.publish_allow
    assert "$KV.jobs.>" not in p.publish_allow
    assert "$JS.API.CONSUMER.MSG.NEXT.CONTROL.scheduler" in p.publish_deny
    # Nobody may delete or purge a stream.
    for r in ROLES:
        for subject in permissions(r, ROLES).publish_allow:
            assert ".DELETE." not in subject or subject.startswith("$JS.API.CONSUMER.DELETE.KV_")
            assert "PURGE" not in subject and subject not in (">", "$JS.>", "$JS.API.>")


def test_the_chart_ships_the_current_users() -> None:
    assert CHART_FILE.read_text() == HEADER + render_users(ROLES) + render_callout(ROLES), (
        f"{CHART_FILE.relative_to(ROOT)} is out of date: run python -m cli.catalog --write")


# --------------------------------------------------------------------------- AsyncAPI


def _expected_operations(t: Routes) -> set[str]:
    from libs.events import event_type_name
    from libs.proto_gen import endpoint_channel
    from libs.routes import health_endpoint

    ops = {f"{t.service}.publishes.{event_type_name(e)}" for e in t.publishes}
    ops |= {f"{t.service}.consumes.{c.durable}.{event_type_name(o.event)}"
            for c in t.consumes for o in c.on}
    served = [s.endpoint for s in t.serves] + ([health_endpoint(t.service)]
                                               if t.service_shell else [])
    ops |= {f"{t.service}.serves.{endpoint_channel(e)}" for e in served}
    ops |= {f"{t.service}.calls.{endpoint_channel(e)}" for e in t.calls}
    ops |= {f"{t.service}.listens.{event_type_name(e)}" for e in t.listens}
    ops |= {f"{t.service}.rereads.{event_type_name(e)}" for e in t.rereads}
    return ops


def test_every_route_entry_is_an_asyncapi_operation_and_every_operation_an_entry() -> None:
    on_disk = json.loads((ROOT / "proto" / "asyncapi.json").read_text())["operations"]
    expected = set().union(*(_expected_operations(t) for t in ROLES))
    assert set(operations(ROLES)) == expected
    assert set(on_disk) == expected, (
        f"proto/asyncapi.json: operations without a route entry: {sorted(set(on_disk) - expected)}"
        f"; route entries without an operation: {sorted(expected - set(on_disk))} "
        "(run python -m cli.catalog --write)")
    for key, op in on_disk.items():
        channel = op["channel"]["$ref"].removeprefix("#/channels/")
        doc = json.loads((ROOT / "proto" / "asyncapi.json").read_text())
        assert channel in doc["channels"], (key, channel)


def test_the_readme_shows_the_current_tables() -> None:
    text = README.read_text()
    assert readme_with_table(text) == text, (
        "README.md's Architecture table is out of date: run python -m cli.catalog --write")
    assert architecture_table().count("\n| ") == 7  # hears, says, keeps, reads, answers, ...


def test_subject_matching() -> None:
    from libs.topology import subject_matches

    assert subject_matches("safe.query.bench.share.*", "safe.query.bench.share.*")
    assert subject_matches("safe.query.>", "safe.query.bench.pair")
    assert not subject_matches("safe.query.bench.pair", "safe.query.bench.*")
    assert not subject_matches("safe.health.x", "safe.health.x.n1")
