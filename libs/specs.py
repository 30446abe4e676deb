"""Loading user-written YAML (hosts.yaml, job.yaml) into pydantic models with
errors a person can act on: the file, the line, the field and what to write
instead, every problem at once, and never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class SpecError(Exception):
    """A user file that cannot be used; ``str()`` is the message to print."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(
            f"{path}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems)
        )


def _line_map(node: yaml.Node, prefix: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], int]:
    """Map each key path in a YAML document to its 1-based line."""
    lines = {prefix: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, key.value)
            lines[path] = key.start_mark.line + 1
            lines.update({k: v for k, v in _line_map(value, path).items() if k != path})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, (*prefix, i)))
    return lines


_HINTS = {
    "missing": "add it",
    "extra_forbidden": "remove it or check its spelling",
    "int_parsing": "write a whole number",
    "int_type": "write a whole number",
    "string_type": "write a text value",
    "literal_error": "use one of the allowed values",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
    "list_type": "write a list (lines starting with '- ')",
    "dict_type": "write a mapping (key: value lines)",
    "too_short": "give at least one item",
}


def format_validation(exc: ValidationError, lines: dict[tuple[Any, ...], int]) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        line = None
        for cut in range(len(loc), -1, -1):
            if loc[:cut] in lines:
                line = lines[loc[:cut]]
                break
        field = ".".join(str(p) for p in loc) or "(document)"
        hint = _HINTS.get(err["type"], "")
        message = err["msg"].removeprefix("Value error, ")
        where = f"line {line}, " if line else ""
        problems.append(f"{where}field '{field}': {message}" + (f" ({hint})" if hint else ""))
    return problems


def load_model(path: str | Path, model: type[M]) -> M:
    """Read ``path`` as YAML and validate it as ``model``; raises SpecError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(path, [f"cannot read the file: {exc.strerror}"]) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(
            path, [f"{where}not valid YAML ({problem}); check indentation and quotes"]
        ) from None
    if not isinstance(data, dict):
        raise SpecError(path, ["the file must be a YAML mapping (key: value lines) at the top"])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = _line_map(node) if node is not None else {}
        raise SpecError(path, format_validation(exc, lines)) from None
