"""Real training-log lines from each framework's own repository and issues
(``fixtures/framework_logs/*.log``, each block citing its source) through
the built-in formats: ``auto`` picks the right format for each whole file,
every line the fixtures' README lists parses to the values it gives, lines
of other kinds (timers, banners, warnings) carry no telemetry, and no line
of one framework is read as another's."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.log_formats import Parsed, Parser

FIXTURES = Path(__file__).parent / "fixtures/framework_logs"
FORMATS = ["megatron", "primus", "torchtitan", "deepspeed", "hf_trainer", "lightning"]


@pytest.fixture(scope="module")
def parser() -> Parser:
    return Parser.load()


def log_lines(name: str) -> list[str]:
    return [line for line in (FIXTURES / f"{name}.log").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def expected(name: str) -> list[dict[str, Any]]:
    """The README's ``yaml`` block under ``### <name>.log``."""
    text = (FIXTURES / "README.md").read_text()
    section = text.split(f"### {name}", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None, f"no expected parses for {name}"
    return yaml.safe_load(block.group(1))


def find(lines: list[str], entry: dict[str, Any]) -> str:
    for line in lines:
        if ("line" in entry and line == entry["line"]) \
                or ("line_startswith" in entry and line.startswith(entry["line_startswith"])) \
                or ("line_contains" in entry and entry["line_contains"] in line):
            return line
    raise AssertionError(f"fixture line not found: {entry}")


@pytest.mark.parametrize("name", FORMATS)
def test_auto_detects_each_frameworks_log(parser: Parser, name: str) -> None:
    assert parser.detect(log_lines(name)) == name


@pytest.mark.parametrize("name", FORMATS)
def test_real_lines_parse_to_what_they_print(parser: Parser, name: str) -> None:
    lines = log_lines(name)
    for entry in expected(name):
        line = find(lines, entry)
        got = parser.parse(line, name)
        assert got is not None, f"{name}: nothing read from {line!r}"
        check(got, entry, line)


def check(got: Parsed, entry: dict[str, Any], line: str) -> None:
    if "iteration" in entry:
        assert got.iteration == entry["iteration"], line
    for key in ("loss", "learning_rate", "step_time_s", "tokens_per_s", "samples_per_s",
                "tflops", "grad_norm", "skipped_iterations", "nan_iterations", "epoch"):
        if key not in entry:
            continue
        want, have = float(entry[key]), got.values.get(key)
        assert have is not None, f"{key} missing from {line!r}: {got.values}"
        if math.isnan(want):
            assert math.isnan(have), (key, line)
        else:
            assert have == pytest.approx(want, rel=1e-4), (key, line, got.values)


@pytest.mark.parametrize("name", FORMATS)
def test_most_lines_of_other_kinds_carry_nothing(parser: Parser, name: str) -> None:
    lines = log_lines(name)
    parsed = parser.parse_lines(lines, name)
    # Every file mixes in timers, banners and warnings: not all lines are telemetry.
    assert 0 < len(parsed) < len(lines)
    for record in parsed:
        if record.kind == "progress":
            assert record.values or record.iteration is not None, record


@pytest.mark.parametrize("name", FORMATS)
def test_no_framework_reads_another_ones_progress_lines(parser: Parser, name: str) -> None:
    # Real logs mix frameworks (HF Trainer runs DeepSpeed, whose timer lines
    # appear in its logs), so this is about each framework's own progress
    # lines; Primus and Megatron-DeepSpeed print Megatron's line on purpose.
    lines = log_lines(name)
    for entry in expected(name):
        line = find(lines, entry)
        for other in FORMATS:
            if other == name or {name, other} <= {"megatron", "primus", "deepspeed"}:
                continue
            assert parser.parse(line, other) is None, (name, other, line)


def test_real_checkpoint_lines(parser: Parser) -> None:
    for entry in expected("Checkpoint lines"):
        name = entry["file"].removesuffix(".log")
        got = parser.parse(find(log_lines(name), entry), name)
        assert got is not None and got.kind == "checkpoint", entry
        assert got.iteration == entry["iteration"] and got.path == entry.get("path"), got
