"""Loading user-written YAML (hosts.yaml, job.yaml) into pydantic models with
errors a person can act on: the file, the line, the field and what to write
instead, every problem at once, and never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from libs import yaml_files

M = TypeVar("M", bound=BaseModel)


class SpecError(Exception):
    """A user file that cannot be used; ``str()`` is the message to print."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(
            f"{path}: {len(problems)} problem(s)\n" + "\n".join(f"  - {p}" for p in problems)
        )


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
    "model_type": "write a mapping (key: value lines)",
    "float_parsing": "write a number",
    "float_type": "write a number",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
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
        # an empty key is shown as '' so the field is still named
        field = ".".join(str(p) if p != "" else "''" for p in loc) or "(document)"
        hint = _HINTS.get(err["type"], "")
        message = err["msg"].removeprefix("Value error, ")
        where = f"line {line}, " if line else ""
        problems.append(f"{where}field '{field}': {message}" + (f" ({hint})" if hint else ""))
    return problems


def load_model(path: str | Path, model: type[M], *, context: dict[str, Any] | None = None) -> M:
    """Read ``path`` as YAML (through libs.yaml_files: bounded, UTF-8, no
    duplicate keys) and validate it as ``model`` (with pydantic ``context``
    for rules that depend on more than the file); raises SpecError."""
    path = Path(path)
    try:
        doc = yaml_files.load(path)
    except yaml_files.YamlFileError as exc:
        raise SpecError(path, exc.problems) from None
    if not isinstance(doc.data, dict):
        raise SpecError(path, ["the file must be a YAML mapping (key: value lines) at the top"])
    try:
        return model.model_validate(doc.data, context=context)
    except ValidationError as exc:
        raise SpecError(path, format_validation(exc, doc.lines)) from None
