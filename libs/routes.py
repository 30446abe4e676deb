"""Route tables: what each service hears, says and keeps, declared once.

Every service has one ``Routes`` (``services/<name>/routes.py``): the events
it handles, grouped into the durable consumers that bring them (subjects
come from the event classes); the events it publishes; the KV buckets it
owns and reads (typed records, ``libs.records``); the request/reply
endpoints it serves and calls, each with its request and reply models; and
the leader leases it campaigns for. Handlers are methods of the service
named in the table; each takes the typed event (``On``) or request.

Everything else is derived from the tables, never written a second time:
the consumers a service starts (``libs.wiring``), the per-service NATS
users (``libs.nats_permissions``), the AsyncAPI operations in ``proto/``
(``libs.proto_gen``) and the README's Architecture table
(``cli.catalog``). A bus that carries a table refuses to publish an
event or use an endpoint the table does not name, so a table cannot fall
behind its service unnoticed.

Everything here is pure data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from libs.events import EVENT_TYPES, SUBJECT_ROOT, Event, event_type_name
from libs.records import BucketSpec
from libs.topology import StreamSpec, stream_of, subject_matches

# A durable with this key in its name exists once per node (bench agents).
NODE_KEY = "{node}"


def event_subject(cls: type[Event], **keys: str) -> str:
    """The subject of ``cls`` events: ``*`` for every key not given."""
    values = {"node": "*", "job": "*", **keys}
    return cls.subject_template.format(root=SUBJECT_ROOT, **values)


@dataclass(frozen=True)
class On:
    """One event a consumer brings and the service method that handles it.
    The method takes the event (``each`` consumers) or, for ``batch``
    consumers, the fetched batch of ``(event, stream sequence)`` pairs."""

    event: type[Event]
    handler: str


ConsumerMode = Literal["each", "batch", "raw"]


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer: which events, from which stream, how.

    ``each``: events one at a time, in stream order. ``batch``: one call
    per fetched batch, for handlers that store many at once. ``raw``: the
    handler decodes messages itself (the telemetry hot path) and returns
    those it refuses with the reason. ``leader``: consumed only while the
    service leads its role (started and stopped with each term). A durable
    with ``{node}`` in its name is one per node, filtered to that node.
    ``replay_s``: a new durable starts this many seconds back in the stream
    instead of at its beginning, for a service that rebuilds its state from
    a KV bucket at start and needs only the changes since (replaying a
    month of history would only be undone by the bucket)."""

    durable: str
    stream: StreamSpec
    on: tuple[On, ...]
    mode: ConsumerMode = "each"
    batch: int = 64
    max_deliver: int = 5
    ack_wait_s: float = 30.0
    fill_s: float = 0.2  # raw: how long a batch may take to fill
    inflight: int = 2  # raw: batches handled at once
    leader: bool = False
    replay_s: float | None = None
    summary: str = ""

    def __post_init__(self) -> None:
        if not self.on:
            raise ValueError(f"consumer {self.durable}: handles no event")
        if self.mode != "each" and len({o.handler for o in self.on}) != 1:
            raise ValueError(f"consumer {self.durable}: a {self.mode} consumer has one handler")
        for o in self.on:
            if stream_of(event_subject(o.event)) != self.stream:
                raise ValueError(f"consumer {self.durable}: {event_type_name(o.event)} is not "
                                 f"in stream {self.stream.name}")

    @property
    def per_node(self) -> bool:
        return NODE_KEY in self.durable

    @property
    def events(self) -> tuple[type[Event], ...]:
        return tuple(dict.fromkeys(o.event for o in self.on))

    def name(self, node: str | None = None) -> str:
        """The durable's name (one per node where it carries ``{node}``)."""
        if not self.per_node:
            return self.durable
        if node is None:
            raise ValueError(f"consumer {self.durable} needs the node it runs for")
        return self.durable.replace(NODE_KEY, node)

    def subjects(self, node: str | None = None) -> tuple[str, ...]:
        """Its filter subjects: one per event type, narrowed to ``node`` for a
        per-node consumer (``*`` otherwise); the stream's own subjects when it
        takes every event of the stream (the history, the telemetry)."""
        if set(self.events) == set(events_of(self.stream, EVENT_TYPES)):
            return self.stream.subjects
        keys = {"node": node} if self.per_node and node is not None else {}
        return tuple(dict.fromkeys(event_subject(e, **keys) for e in self.events))

    def tuned(self, **changes: Any) -> Consumer:
        """The same consumer with other batch/fill/ack settings (a service's
        constructor arguments, tests)."""
        return replace(self, **changes)


class Reply(BaseModel):
    """Every reply says whether the request was served, and if not, why."""

    model_config = ConfigDict(extra="allow")

    ok: bool = True
    error: str | None = None


class Empty(BaseModel):
    """A request with nothing in it."""

    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class Endpoint:
    """A core-NATS subject outside every stream: a request answered with
    ``reply`` (request/reply), or, with ``reply=None``, one-way messages.
    ``subject`` may hold keys in braces (``safe.query.bench.turn.{session}``)."""

    subject: str
    request: type[BaseModel]
    reply: type[BaseModel] | None
    summary: str

    @property
    def pattern(self) -> str:
        """The subject with every key as ``*`` (what permissions name)."""
        return re.sub(r"\{[a-z_]+\}", "*", self.subject)

    def at(self, **keys: str) -> str:
        return self.subject.format(**keys)


def query(name: str) -> str:
    """A request/reply subject: ``safe.query.<name>``."""
    return f"{SUBJECT_ROOT}.query.{name}"


class HealthReply(Reply):
    """A service's health (the shell's figures plus the service's own)."""

    service: str
    node: str | None = None
    uptime_s: float = 0.0
    connection: str = "connected"
    reconnects: int = 0
    disconnects: int = 0
    delivered: int = 0
    handled: int = 0
    dead_lettered: int = 0
    unknown_fields: dict[str, int] = Field(default_factory=dict)
    skewed_stamps: dict[str, int] = Field(default_factory=dict)
    metrics_port: int | None = Field(default=None, description="where /metrics is served")


def health_endpoint(service: str, instance: str | None = None) -> Endpoint:
    """``safe.health.<service>`` (any replica answers) or, with ``instance``
    (a node's agent, a pod), ``safe.health.<service>.<instance>`` (that one)."""
    subject = f"{SUBJECT_ROOT}.health.{service}" + (f".{instance}" if instance else "")
    return Endpoint(subject, Empty, HealthReply, f"is {service} up, and what it counts")


@dataclass(frozen=True)
class Serve:
    """An endpoint a service answers with its method ``handler`` (taking the
    request model, returning the reply model). ``queue``: replicas share the
    requests. ``leader``: answered only while the service leads. Without a
    handler the service subscribes itself, per key, at run time (a sweep's
    turns)."""

    endpoint: Endpoint
    handler: str | None
    queue: str = ""
    leader: bool = False


@dataclass(frozen=True)
class Routes:
    """One service's (or NATS user's) whole wiring."""

    service: str
    summary: str
    consumes: tuple[Consumer, ...] = ()
    publishes: tuple[type[Event], ...] = ()
    owns: tuple[BucketSpec[Any], ...] = ()
    reads: tuple[BucketSpec[Any], ...] = ()
    serves: tuple[Serve, ...] = ()
    calls: tuple[Endpoint, ...] = ()  # endpoints it requests or sends to
    listens: tuple[type[Event], ...] = ()  # events it watches live (core subscription)
    rereads: tuple[type[Event], ...] = ()  # events it looks up in their stream (read only)
    leases: tuple[str, ...] = ()  # roles it campaigns for (libs.leader)
    service_shell: bool = True  # runs under libs/service.py: topology, health
    # A platform NATS user with a password (False: the SDK's table, whose
    # workers log in with their job's credential, libs/job_credentials.py).
    nats_user: bool = True
    # Answers nats-server's auth callout ($SYS.REQ.USER.AUTH): the scheduler.
    auth_callout: bool = False

    def __post_init__(self) -> None:
        names = [c.durable for c in self.consumes]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.service}: a durable is declared twice")
        for handler in self.handlers:
            if not handler.startswith("on_"):
                raise ValueError(f"{self.service}: handler {handler!r}: route handlers are "
                                 "named on_<what> (and nothing else is)")

    @property
    def handled(self) -> tuple[type[Event], ...]:
        return tuple(dict.fromkeys(e for c in self.consumes for e in c.events))

    @property
    def handlers(self) -> dict[str, tuple[str, type[Any]]]:
        """Method name -> (what kind of route, what it takes)."""
        out: dict[str, tuple[str, type[Any]]] = {}
        for c in self.consumes:
            for o in c.on:
                out[o.handler] = (c.mode, o.event)
        for s in self.serves:
            if s.handler is not None:
                out[s.handler] = ("serve", s.endpoint.request)
        return out

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Every endpoint it serves, its health included."""
        own = (health_endpoint(self.service),) if self.service_shell else ()
        return own + tuple(s.endpoint for s in self.serves)

    def consumer(self, durable: str) -> Consumer:
        for c in self.consumes:
            if c.durable == durable:
                return c
        raise KeyError(f"{self.service} declares no consumer {durable!r}")

    def may_publish(self, cls: type[Event]) -> bool:
        return cls in self.publishes

    def may_call(self, subject: str) -> bool:
        return any(subject_matches(e.pattern, subject) for e in self.calls)

    def may_serve(self, subject: str) -> bool:
        own_health = f"{health_endpoint(self.service).subject}.*"
        if self.service_shell and subject_matches(own_health, subject):
            return True  # a replica's (or a node's agent's) own health subject
        return any(subject_matches(e.pattern, subject) for e in self.endpoints)


def events_of(stream: StreamSpec, events: Iterable[type[Event]]) -> tuple[type[Event], ...]:
    """The event classes whose subjects lie in ``stream``."""
    return tuple(e for e in events if stream_of(event_subject(e)) == stream)
