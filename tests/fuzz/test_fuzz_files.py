"""Fuzzing the files users write: job.yaml and hosts.yaml.

hypothesis starts from the valid examples and mutates them two ways: as
bytes (cut, spliced, YAML punctuation and anchors inserted, odd encodings)
and as data (any field replaced by any YAML value, removed, or joined by
unknown ones, then written back out as YAML). Loading the result must give
a model or a SpecError whose every problem says where (a line or a field;
a file that parses names the field), never another exception, a hang or
unbounded memory; a hosts file that loads must also render. Derandomized
and database-free, so CI sees the same examples every run.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.events import JobSpec
from libs.inventory import HostsFile
from libs.specs import SpecError, load_model
from services.bootstrap.render import render
from tests.helpers import ROOT

FUZZ = settings(max_examples=150, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MODELS: dict[str, type[Any]] = {"job.yaml": JobSpec, "hosts.yaml": HostsFile}
SEEDS = {name: (ROOT / "examples" / name).read_bytes() for name in MODELS}
# Problems that concern the whole file, so have no line or field to name.
WHOLE_FILE = ("the file is larger than", "the file is UTF-16", "the file must be a YAML mapping",
              "aliases (*name) expand", "nested more than")

TOKENS = [b"&a ", b"*a", b"<<: *a\n", b"[", b"]", b"{", b"}", b": ", b"- ", b"? ", b"\t",
          b"!!binary ", b"!!python/object:os.system ", b"---\n", b"...\n", b"'", b'"', b"#",
          b"\n  ", b"\x00", b"\xff\xfe", b"\xe9", b"\xf0\x9f\x9a\x80", b"\\0", b".nan",
          b"-----BEGIN RSA PRIVATE KEY-----", b"a/b.c >*", b"0x7fffffffffffffffffff",
          b"2024-13-45", b"~", b"null", b"&b [*a, *a, *a, *a]\n"]


@st.composite
def byte_mutations(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "truncate"]))
        if kind == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(max_size=8))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif kind == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "dup_line":
            lines = bytes(data).splitlines(keepends=True)
            if lines:
                i = draw(st.integers(0, len(lines) - 1))
                lines.insert(draw(st.integers(0, len(lines))), lines[i])
                data = bytearray(b"".join(lines))
        elif kind == "truncate":
            del data[at:]
    return bytes(data)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(paths(v, (*prefix, k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.extend(paths(v, (*prefix, i)))
    return out


@st.composite
def data_mutations(draw: st.DrawFn, seed: bytes) -> bytes:
    doc = yaml.safe_load(seed)
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(paths(doc)[1:]))
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        kind = draw(st.sampled_from(["replace", "remove", "add"]))
        if kind == "replace":
            parent[where[-1]] = draw(yaml_values)
        elif kind == "remove":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(yaml_values)
        paths_left = paths(doc)
        if len(paths_left) < 2:
            break
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans())).encode()


def check(tmp_path: Path, name: str, content: bytes, *, parses: bool) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    try:
        model = load_model(path, MODELS[name])
    except SpecError as exc:
        assert exc.problems, content
        for problem in exc.problems:
            named = "field '" in problem if parses else ("field '" in problem
                                                         or problem.startswith("line "))
            assert named or problem.startswith(WHOLE_FILE), (problem, content)
            assert "Traceback" not in problem
        return
    if isinstance(model, HostsFile):
        render(model)  # what plan and apply do next must not fail either
    else:
        assert len(model.model_dump_json()) < 1024 * 1024


@pytest.mark.parametrize("name", list(MODELS))
def test_byte_mutations_load_or_are_refused_with_a_place(tmp_path: Path, name: str) -> None:
    @FUZZ
    @given(content=byte_mutations(SEEDS[name]))
    def run(content: bytes) -> None:
        check(tmp_path, name, content, parses=False)

    run()


@pytest.mark.parametrize("name", list(MODELS))
def test_data_mutations_are_refused_naming_a_field(tmp_path: Path, name: str) -> None:
    @FUZZ
    @given(content=data_mutations(SEEDS[name]))
    def run(content: bytes) -> None:
        check(tmp_path, name, content, parses=True)

    run()


@st.composite
def alias_chains(draw: st.DrawFn) -> bytes:
    """Anchors fanned out level on level: a bomb when fan-out^depth is large."""
    fan, depth = draw(st.integers(1, 30)), draw(st.integers(1, 12))
    lines = ["name: x", "workers: 1", "command: [a]", "l0: &l0 [x, x, x]"]
    for i in range(1, depth + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]")
    return ("\n".join(lines) + "\n").encode()


def test_alias_chains_never_grow_memory_without_bound(tmp_path: Path) -> None:
    @settings(max_examples=60, deadline=2000, derandomize=True, database=None)
    @given(content=alias_chains())
    def run(content: bytes) -> None:
        tracemalloc.start()
        try:
            check(tmp_path, "job.yaml", content, parses=False)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024 * 1024, peak

    run()
