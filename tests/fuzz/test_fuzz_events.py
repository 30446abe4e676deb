"""Fuzzing every event model the way a consumer reads it.

Each event type gets a valid example built from its own JSON Schema (so a
new event type is covered without touching this file), and hypothesis
mutates it: fields removed, replaced by any JSON, unknown fields added, the
version and type changed, the bytes cut or spliced, deep nesting. Reading
the result (``read_event``, and the bus's refusal path that every consumer
goes through) must either give an event or refuse it with a reason that
names the field, and never raise anything else, hang or blow up memory.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from libs.bus import event_or_reason
from libs.events import (
    EVENT_TYPES,
    Event,
    UnknownEventType,
    UnsupportedVersion,
    read_event,
)

FUZZ = settings(max_examples=300, deadline=500, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
KEY = "node-1"


def _example(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A value the schema accepts: the smallest that fits, keys kept valid."""
    if "$ref" in schema:
        return _example(defs[schema["$ref"].split("/")[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return _example(options[0], defs)
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _example(props[name], defs) for name in schema.get("required", [])}
    if kind == "array":
        item = _example(schema.get("items", {}), defs)
        return [item] * max(schema.get("minItems", 0), 1 if "items" in schema else 0)
    if kind == "string":
        return "2026-01-01T00:00:00Z" if schema.get("format") == "date-time" else KEY
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), int(schema.get("exclusiveMinimum", 0)) + 1)
    if kind == "number":
        return float(max(schema.get("minimum", 1.0), schema.get("exclusiveMinimum", 0.0) + 1))
    if kind == "boolean":
        return True
    return None


def _valid_doc(cls: type[Event]) -> dict[str, Any]:
    schema = cls.model_json_schema()
    doc = _example(schema, schema.get("$defs", {}))
    doc.update(type=cls.model_fields["type"].default, node=KEY, job=KEY)
    return doc


SAMPLES = {cls.model_fields["type"].default: _valid_doc(cls) for cls in EVENT_TYPES}


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_event_type_has_a_valid_example(kind: str) -> None:
    event, unknown = read_event(json.dumps(SAMPLES[kind]))
    assert event.type == kind and unknown == ()


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any, *, delete: bool = False) -> None:
    for step in path[:-1]:
        doc = doc[step]
    if delete and isinstance(doc, dict):
        doc.pop(path[-1], None)
    else:
        doc[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(sorted(SAMPLES)))
    doc = json.loads(json.dumps(SAMPLES[kind]))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        action = draw(st.sampled_from(["replace", "delete", "add", "version", "type", "deep"]))
        if action in ("replace", "delete") and paths:
            _set(doc, draw(st.sampled_from(paths)), draw(_json), delete=action == "delete")
        elif action == "add":
            targets = [p for p in paths if isinstance(_get(doc, p), dict)] + [()]
            _set_in(doc, draw(st.sampled_from(targets)), draw(st.text(min_size=1, max_size=8)),
                    draw(_json))
        elif action == "version":
            doc["version"] = draw(st.integers(-5, 2**40) | _json)
        elif action == "type":
            doc["type"] = draw(st.sampled_from(sorted(SAMPLES)) | st.text(max_size=12))
        elif action == "deep":
            doc["data"] = json.loads("[" * 200 + "]" * 200)
    raw = json.dumps(doc).encode()
    cut = draw(st.sampled_from(["none", "truncate", "splice"]))
    if cut == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif cut == "splice":
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=16)) + raw[at:]
    return raw


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _set_in(doc: Any, path: tuple[Any, ...], key: str, value: Any) -> None:
    _get(doc, path)[key] = value


@FUZZ
@given(mutated())
def test_a_mutated_event_is_read_or_refused_with_a_reason(raw: bytes) -> None:
    try:
        event, unknown = read_event(raw)
    except UnsupportedVersion as exc:
        assert "not supported (max" in str(exc)
        return
    except UnknownEventType as exc:
        assert str(exc).startswith("field 'type'")
        return
    except ValidationError as exc:
        for error in exc.errors():
            # Every refusal names a field, unless the bytes are not JSON at all.
            assert error["loc"] or error["type"].startswith("json"), error
        return
    assert isinstance(event, Event)
    assert all(path for path in unknown)


@FUZZ
@given(mutated(), st.sampled_from(sorted(SAMPLES)))
def test_the_bus_refuses_with_one_line_or_hands_over_an_event(raw: bytes, kind: str) -> None:
    """What every consumer runs before its handler: a reason or an event of that subject."""
    cls = next(c for c in EVENT_TYPES if c.model_fields["type"].default == kind)
    subject = cls.subject_template.format(root="safe", node=KEY, job=KEY)
    outcome = event_or_reason(subject, raw)
    if isinstance(outcome, str):
        assert outcome and "\n" not in outcome and len(outcome) <= 1000
    else:
        assert outcome[0].subject == subject
