"""The one way a user's YAML file (job.yaml, hosts.yaml) is read.

A file a person wrote, or a hostile one, must either give plain data with
the line of every key or be refused with one message naming the line and
the fix, in bounded time and memory. So, in this order: the size is
checked before anything is read into memory; the bytes must be UTF-8 text
(UTF-16, Latin-1 or binary files are named as such); the document is
composed once, by libyaml's C parser when present (the pure-Python one
took most of a 10,000-node ``bootstrap plan``); then one walk over the
node graph, before anything is built, refuses nesting that is too deep,
duplicate keys (both lines named) and aliases beyond a count or an
expanded size (an alias bomb is a few hundred bytes that expand to
gigabytes), and records each key's line. Only then are Python objects
constructed from the already-composed nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from libs.gc_pause import paused_gc

# A 10,000-node hosts file is about 1.3 MB; nothing a person writes is near this.
MAX_BYTES = 8 * 1024 * 1024
# Job and hosts files nest four or five levels; 32 leaves room and stops stack abuse.
MAX_DEPTH = 32
# Anchors are legitimate (shared labels); these bound what they may cost.
MAX_ALIASES = 1000
MAX_ALIAS_EXPANSION = 100_000  # nodes added by expanding aliases, over the file's own

_Base: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _Base is not yaml.SafeLoader


class _Loader(_Base):  # type: ignore[misc,valid-type]
    """The safe loader, less implicit timestamps: no field here is a date, and
    ``since: 2024-01-01`` in labels must stay the text the user wrote."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in _Base.yaml_implicit_resolvers.items()}


# Characters YAML 1.1 refuses in a stream; finding them ourselves gives the line.
_UNPRINTABLE = re.compile(
    "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

Path_ = tuple[Any, ...]


class YamlFileError(Exception):
    """A file that is not usable YAML; ``problems`` are lines to show."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class YamlDoc:
    data: Any
    lines: dict[Path_, int]  # key path -> 1-based line


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def read_text(path: Path, *, max_bytes: int = MAX_BYTES) -> str:
    """The file as text, refused before parsing when too big or not UTF-8."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)  # never more, even from a device or a pipe
    except OSError as exc:
        raise YamlFileError([f"cannot read the file: {exc.strerror}"]) from None
    if len(raw) > max_bytes:
        raise YamlFileError([f"the file is larger than the {_mib(max_bytes)} limit; "
                             "a job or hosts file is a few kilobytes to a few megabytes"])
    utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
    if utf16 or (len(raw) > 1 and raw.count(b"\x00") * 4 >= len(raw)):
        raise YamlFileError(["the file is UTF-16 (or binary), not UTF-8 text; save it as UTF-8"])
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is harmless
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise YamlFileError([
            f"line {line}: byte 0x{raw[exc.start]:02x} is not UTF-8 (the file looks like "
            "Latin-1 or another encoding); save it as UTF-8"]) from None
    bad = _UNPRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        kind = "a NUL byte: the file looks binary" if bad.group() == "\x00" else (
            f"the control character U+{ord(bad.group()):04X}")
        raise YamlFileError([f"line {line}: {kind}; a YAML file is plain UTF-8 text"])
    return text


def _key_of(node: yaml.Node) -> Any:
    # Only scalar keys name a field; anything else gets a placeholder that
    # keeps the path hashable (the constructor refuses such keys anyway).
    return node.value if isinstance(node, yaml.ScalarNode) else "<complex key>"


def _walk(root: yaml.Node) -> dict[Path_, int]:
    """Check the composed graph and map key paths to lines; raises
    YamlFileError. Iterative, so depth is our limit, not Python's stack."""
    lines: dict[Path_, int] = {(): root.start_mark.line + 1}
    problems: list[str] = []
    seen: set[int] = set()  # collection nodes already walked once
    aliases = 0
    # (node, path, depth); an alias is a node met a second time
    stack: list[tuple[yaml.Node, Path_, int]] = [(root, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        lines.setdefault(path, node.start_mark.line + 1)  # list items; keys set it first
        if isinstance(node, yaml.ScalarNode):
            continue
        if id(node) in seen:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise YamlFileError([f"line {node.start_mark.line + 1}: more than "
                                     f"{MAX_ALIASES} alias uses (*name); write the values out"])
            continue  # an alias's subtree was checked where its anchor stands
        seen.add(id(node))
        if depth > MAX_DEPTH:
            raise YamlFileError([f"line {node.start_mark.line + 1}: nested more than "
                                 f"{MAX_DEPTH} levels deep; flatten the structure"])
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            children = []
            for key, value in node.value:
                name = _key_of(key)
                line = key.start_mark.line + 1
                child = (*path, name)
                if name == "<<":  # a merge key: its keys are checked where they are written
                    children.append((value, path, depth + 1))
                    continue
                if isinstance(key, yaml.ScalarNode) and name in first:
                    field = ".".join(str(p) for p in child)
                    problems.append(f"line {line}, field '{field}': duplicate key (first at "
                                    f"line {first[name]}); keep one of the two")
                else:
                    first[name] = line
                    lines.setdefault(child, line)
                children.append((value, child, depth + 1))
            stack.extend(reversed(children))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i), depth + 1)
                         for i, item in reversed(list(enumerate(node.value))))
    if problems:
        raise YamlFileError(problems)
    if aliases:
        _check_expansion(root)
    return lines


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a graph whose aliases, once expanded, add more than
    MAX_ALIAS_EXPANSION nodes (or refer to themselves). Memoized post-order,
    so a bomb is measured in time linear in the file, never expanded."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    distinct = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if done:
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            open_.discard(id(node))
            continue
        if id(node) in size:
            continue
        if id(node) in open_:
            raise YamlFileError([f"line {node.start_mark.line + 1}: an alias refers to a "
                                 "collection that contains it; write the values out"])
        distinct += 1
        open_.add(id(node))
        stack.append((node, True))
        for kid in kids:
            if id(kid) in open_:
                raise YamlFileError([f"line {kid.start_mark.line + 1}: an alias refers to a "
                                     "collection that contains it; write the values out"])
            if id(kid) not in size:
                stack.append((kid, False))
    if size[id(root)] - distinct > MAX_ALIAS_EXPANSION:
        raise YamlFileError([f"aliases (*name) expand the file by {size[id(root)] - distinct:,} "
                             f"values, over the limit of {MAX_ALIAS_EXPANSION:,}; write the "
                             "values out or use fewer aliases"])


def _syntax(exc: yaml.YAMLError) -> YamlFileError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if "nesting depth" in problem:  # libyaml's own limit, far above ours
        return YamlFileError([f"{where}nested more than {MAX_DEPTH} levels deep; "
                              "flatten the structure"])
    return YamlFileError([f"{where}not valid YAML ({problem}); check indentation and quotes"])


def parse(text: str) -> YamlDoc:
    """Compose once, check the graph, then construct; raises YamlFileError."""
    # The nodes of a document are many young objects, not garbage: the
    # collector's repeated passes over them were two thirds of reading a
    # 10,000-node file. Nothing built here is cyclic (self-referring aliases
    # are refused), so nothing waits for the collector afterwards.
    with paused_gc():
        return _parse(text)


def _parse(text: str) -> YamlDoc:
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the pure-Python composer on deep input
            raise YamlFileError([f"nested more than {MAX_DEPTH} levels deep; "
                                 "flatten the structure"]) from None
        if node is None:
            return YamlDoc(None, {})
        lines = _walk(node)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _syntax(exc) from None
    except (TypeError, ValueError, OverflowError) as exc:
        # the constructor on odd scalars (e.g. a timestamp out of range)
        raise YamlFileError([f"a value cannot be read ({exc}); quote it to keep it as text"]
                            ) from None
    finally:
        loader.dispose()
    return YamlDoc(data, lines)


def load(path: Path, *, max_bytes: int = MAX_BYTES) -> YamlDoc:
    """Read and parse a user's YAML file; raises YamlFileError."""
    return parse(read_text(path, max_bytes=max_bytes))
