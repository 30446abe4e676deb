"""Training-framework log lines as job telemetry (pure).

An unmodified Megatron-LM, Primus, torchtitan, DeepSpeed, Hugging Face
Trainer or PyTorch Lightning job prints its progress; this module turns
those lines into the same fields the SDK reports (iteration, loss, learning
rate, step time, throughput, grad norm, skipped/NaN iteration counts) and
checkpoint saves. The patterns are data (``libs/log_formats.yaml``, or a
file of the same shape), so a new framework or a changed format is a YAML
edit: each format has ``detect`` patterns (which lines say "this is me")
and ``rules``; a rule's ``match`` finds the line and may capture
``iteration`` (and ``path`` for a checkpoint), and each field has its own
pattern, searched anywhere in the line (frameworks reorder and add fields
between versions). ``{num}`` in a pattern stands for a number as
frameworks print it: ``1,234``, ``7.1E+00``, ``nan``, ``-inf``.

A NaN or infinite loss stays NaN/inf (it is what the alert rules look
for); a line that matches no rule is not telemetry, never an error; a
malformed rule fails when the file is loaded, naming the file, the format,
the rule and the field.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from libs.specs import load_model

BUILTIN = Path(__file__).with_name("log_formats.yaml")
NUM = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
# Terminal colours (torchtitan's metrics line, rich, tqdm) and carriage
# returns (progress bars redrawn on one line) are not part of the text.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FIELDS = ("loss", "learning_rate", "step_time_s", "tokens_per_s", "samples_per_s", "tflops",
          "grad_norm", "skipped_iterations", "nan_iterations", "epoch")
_DETECT_LINES = 2000  # ``auto`` looks at this many lines at most


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern.replace("{num}", f"(?:{NUM})"), re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"pattern {pattern[:80]!r} is not a regular expression: {exc}") from None


class FieldRule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pattern: str = Field(description="a regex with one group, the value")
    scale: float = Field(default=1.0, gt=0, description="multiply by this (ms -> s: 0.001)")
    invert: bool = Field(default=False, description="the value is a rate: 1/value (it/s -> s)")

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        if _compile(value).groups < 1:
            raise ValueError(f"pattern {value[:80]!r} captures nothing: put the value in ( )")
        return value


class Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: Literal["progress", "checkpoint"] = "progress"
    contains: str = Field(default="", description="text every line of this rule has, as "
                          "written (case-sensitive); checked before the regex, since most "
                          "lines of a log are not telemetry")
    match: str = Field(description="the line this rule reads; may capture (?P<iteration>...) "
                       "and, for a checkpoint, (?P<path>...)")
    fields: dict[str, FieldRule | list[FieldRule]] = Field(
        default_factory=dict, description="a field's pattern, or several tried in order (the "
        "first that matches gives the value: `s/it` and `it/s` progress bars)")

    @field_validator("match")
    @classmethod
    def _match(cls, value: str) -> str:
        _compile(value)
        return value

    @field_validator("fields")
    @classmethod
    def _known(cls, value: dict[str, FieldRule | list[FieldRule]]
               ) -> dict[str, FieldRule | list[FieldRule]]:
        unknown = sorted(set(value) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}: use {', '.join(FIELDS)}")
        return value


class Format(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = ""
    source: str = Field(default="", description="where the printed format is defined")
    detect: list[str] = Field(min_length=1, description="patterns only this framework prints")
    rules: list[Rule] = Field(min_length=1)

    @field_validator("detect")
    @classmethod
    def _detect(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _compile(pattern)
        return value

    @model_validator(mode="after")
    def _unique(self) -> Format:
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError("rule names must be unique within a format")
        return self


class FormatFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    formats: dict[str, Format] = Field(min_length=1)


@dataclass(frozen=True)
class Parsed:
    """One line's telemetry. ``iteration`` is None where the framework does
    not print it (Hugging Face's loss dicts)."""

    format: str
    kind: Literal["progress", "checkpoint"]
    iteration: int | None
    line_no: int
    values: dict[str, float] = field(default_factory=dict)
    path: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"line": self.line_no, "format": self.format,
                                  "kind": self.kind, "iteration": self.iteration}
        out.update({k: _json_number(v) for k, v in self.values.items()})
        if self.path is not None:
            out["path"] = self.path
        return out


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # nan/inf stay visible


def number(text: str) -> float:
    """A number as a framework prints it: thousands commas, E notation,
    nan/inf in any case."""
    return float(text.replace(",", "").strip())


@dataclass(frozen=True)
class _Compiled:
    name: str
    detect: tuple[re.Pattern[str], ...]
    rules: tuple[tuple[Rule, re.Pattern[str],
                       tuple[tuple[str, tuple[tuple[FieldRule, re.Pattern[str]], ...]], ...]],
                 ...]


class Parser:
    """The formats of a file, compiled once; ``parse`` is per line."""

    def __init__(self, formats: FormatFile) -> None:
        self.formats = formats
        self._compiled = {
            name: _Compiled(name, tuple(_compile(p) for p in f.detect), tuple(
                (r, _compile(r.match), tuple(
                    (k, tuple((fr, _compile(fr.pattern))
                              for fr in (frs if isinstance(frs, list) else [frs])))
                    for k, frs in r.fields.items()))
                for r in f.rules))
            for name, f in formats.formats.items()}

    @classmethod
    def load(cls, *paths: Path) -> Parser:
        """The built-in formats, then each file's (a later format of the
        same name replaces the earlier); SpecError names file, line, field."""
        merged: dict[str, Format] = {}
        for path in (BUILTIN, *paths):
            merged.update(load_model(path, FormatFile).formats)
        return cls(FormatFile(formats=merged))

    @property
    def names(self) -> list[str]:
        return list(self._compiled)

    def detect(self, lines: Iterable[str]) -> str | None:
        """The format whose detect patterns match most often in the first
        lines; None when none matches."""
        hits: Counter[str] = Counter()
        for i, raw in enumerate(lines):
            if i >= _DETECT_LINES:
                break
            line = clean(raw)
            for c in self._compiled.values():
                # Every pattern a line matches counts: a format that extends
                # another (Primus's Megatron lines) lists the other's patterns
                # plus its own, and wins on its own lines; a tie goes to the
                # format listed first.
                hits[c.name] += sum(1 for p in c.detect if p.search(line))
        best = max(hits.values(), default=0)
        return next((n for n in self._compiled if hits[n] == best), None) if best else None

    def parse(self, line: str, fmt: str, line_no: int = 0) -> Parsed | None:
        """The telemetry of one line in format ``fmt``; None when no rule reads it."""
        text = clean(line)
        for rule, match, fields in self._compiled[fmt].rules:
            if rule.contains and rule.contains not in text:
                continue
            found = match.search(text)
            if found is None:
                continue
            groups = found.groupdict()
            values: dict[str, float] = {}
            for key, choices in fields:
                value = _first(text, choices)
                if value is not None:
                    values[key] = value
            iteration = groups.get("iteration")
            return Parsed(format=fmt, kind=rule.kind, line_no=line_no,
                          iteration=int(number(iteration)) if iteration else None,
                          values=values, path=groups.get("path"))
        return None

    def parse_lines(self, lines: Iterable[str], fmt: str = "auto") -> list[Parsed]:
        """Every line that says something; ``auto`` detects the format first."""
        lines = list(lines)
        name = self.detect(lines) if fmt == "auto" else fmt
        if name is None:
            return []
        if name not in self._compiled:
            raise KeyError(f"unknown log format {name!r}: known are {', '.join(self.names)}")
        return [p for i, line in enumerate(lines, 1)
                if (p := self.parse(line, name, i)) is not None]


@cache
def builtin_parser() -> Parser:
    """The repository's formats, compiled once per process."""
    return Parser.load()


def check_format_name(name: str, own: Iterable[str] = ()) -> str:
    """``name`` if a job may ask for it: ``auto``, ``none``, a built-in
    format or one of the job's own; else a ValueError listing them."""
    known = ["auto", "none", *builtin_parser().names, *own]
    if name not in known:
        raise ValueError(f"log_format {name[:60]!r} is not a format: use one of "
                         f"{', '.join(known)}, or define it under log_formats")
    return name


def _first(text: str, choices: tuple[tuple[FieldRule, re.Pattern[str]], ...]) -> float | None:
    """The value of the first pattern that matches and reads as a number."""
    for fr, pattern in choices:
        m = pattern.search(text)
        if m is None:
            continue
        try:
            value = number(m.group(1))
        except ValueError:
            continue
        if fr.invert:
            value = 1.0 / value if value else math.inf
        return value * fr.scale
    return None


def clean(line: str) -> str:
    """The text of a line: colours gone, only what a carriage return left last."""
    return _ANSI.sub("", line.rstrip("\r\n").rsplit("\r", 1)[-1])
