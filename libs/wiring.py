"""A route table brought to life: the consumers and endpoints of a
service's ``Routes``, started for one service instance (or one leader term)
and stopped together.

Handlers are the methods the table names; ``bind`` checks each against the
table before anything starts (it exists, and takes the event or request
model its route brings), so a table and its service cannot disagree at run
time. Dispatch is by event type: one consumer may bring several events,
each to its own typed handler.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from types import UnionType
from typing import Any

from libs.bus import Bus, Served
from libs.consume import Consumers
from libs.events import Event, event_type_name
from libs.routes import Consumer, Routes


class RouteMismatch(TypeError):
    """A route table names a handler its service does not have as declared."""


def _accepts(annotation: Any) -> set[Any]:
    """The types a parameter annotation admits (a union's members)."""
    if isinstance(annotation, UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation))
    return {annotation}


def _first_param(method: Callable[..., Any]) -> Any:
    try:
        hints = typing.get_type_hints(method)
    except Exception as exc:
        raise RouteMismatch(f"{method.__qualname__}: its annotations do not resolve ({exc})"
                            ) from None
    params = [p for p in inspect.signature(method).parameters.values()
              if p.name not in ("self", "cls")]
    if not params:
        raise RouteMismatch(f"{method.__qualname__} takes nothing; a handler takes what its "
                            "route brings")
    return hints.get(params[0].name, inspect.Parameter.empty)


def bind(routes: Routes, target: object) -> dict[str, Callable[..., Awaitable[Any]]]:
    """Every handler the table names, bound to ``target``; raises
    ``RouteMismatch`` for one that is missing or takes something else."""
    bound: dict[str, Callable[..., Awaitable[Any]]] = {}
    owner = target.__name__ if isinstance(target, type) else type(target).__name__
    for name, (kind, takes) in routes.handlers.items():
        method = getattr(target, name, None)
        if method is None or not inspect.iscoroutinefunction(method):
            raise RouteMismatch(f"{routes.service}: the route table names {name}, but "
                                f"{owner} has no async method of that name")
        annotation = _first_param(method)
        if kind == "each":
            wanted = {o.event for c in routes.consumes for o in c.on if o.handler == name}
            if not wanted <= _accepts(annotation):
                raise RouteMismatch(
                    f"{owner}.{name} takes {annotation}, but its routes bring "
                    f"{', '.join(sorted(event_type_name(e) for e in wanted))}")
        elif kind == "serve" and annotation is not takes:
            raise RouteMismatch(f"{owner}.{name} takes {annotation}, but its "
                                f"endpoint's request is {takes.__name__}")
        elif kind in ("batch", "raw") and typing.get_origin(annotation) is not list:
            raise RouteMismatch(f"{owner}.{name} takes {annotation}; a {kind} "
                                "handler takes the list of what was fetched")
        bound[name] = method
    return bound


def _dispatcher(consumer: Consumer, handlers: dict[str, Callable[..., Awaitable[Any]]]
                ) -> Callable[[Event], Awaitable[None]]:
    by_type = {event_type_name(o.event): handlers[o.handler] for o in consumer.on}

    async def dispatch(event: Event) -> None:
        handler = by_type.get(event.type)
        if handler is None:  # its subject filter lets only these through
            raise ValueError(f"consumer {consumer.durable} has no handler for {event.type}")
        await handler(event)

    return dispatch


class Wiring:
    """The part of a table that runs together: everything but the leader's
    routes (``leader=False``), or the leader's routes for one term."""

    def __init__(self, bus: Bus, routes: Routes, target: object, *, leader: bool = False,
                 node: str | None = None, tune: dict[str, dict[str, Any]] | None = None
                 ) -> None:
        self.bus, self.routes, self.target = bus, routes, target
        self.leader, self.node = leader, node
        self.tune = tune or {}
        self.handlers = bind(routes, target)
        self._group: Consumers | None = None
        self._served: list[Served] = []

    async def start(self) -> None:
        group = self._group = self.bus.group()
        for consumer in self.routes.consumes:
            if consumer.leader != self.leader:
                continue
            c = consumer.tuned(**self.tune.get(consumer.durable, {}))
            name, subjects = c.name(self.node), list(c.subjects(self.node))
            handler = self.handlers[c.on[0].handler]
            if c.mode == "each":
                group.consume(durable=name, subjects=subjects, stream=c.stream,
                              handler=_dispatcher(c, self.handlers), batch=c.batch,
                              max_deliver=c.max_deliver, ack_wait_s=c.ack_wait_s,
                              replay_s=c.replay_s)
            elif c.mode == "batch":
                group.consume(durable=name, subjects=subjects, stream=c.stream,
                              batch_handler=handler, batch=c.batch,
                              max_deliver=c.max_deliver, ack_wait_s=c.ack_wait_s)
            else:
                group.consume_raw(durable=name, subjects=subjects, stream=c.stream,
                                  handler=handler, batch=c.batch, fill_s=c.fill_s,
                                  max_deliver=c.max_deliver, ack_wait_s=c.ack_wait_s,
                                  inflight=c.inflight)
        for serve in self.routes.serves:
            if serve.leader != self.leader or serve.handler is None:
                continue
            self._served.append(await self.bus.serve(
                serve.endpoint, self.handlers[serve.handler], queue=serve.queue))

    async def stop(self) -> None:
        """Stop answering and consuming (the batch in hand is finished first)."""
        for served in self._served:
            await served.stop()
        self._served.clear()
        if self._group is not None:
            await self.bus.stop_group(self._group)
            self._group = None


async def wire(bus: Bus, routes: Routes, target: object, *, leader: bool = False,
               node: str | None = None, tune: dict[str, dict[str, Any]] | None = None
               ) -> Wiring:
    """Start the routes of ``routes`` that run together (see ``Wiring``)."""
    wiring = Wiring(bus, routes, target, leader=leader, node=node, tune=tune)
    await wiring.start()
    return wiring
