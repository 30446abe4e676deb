"""Training-log formats as data (``libs/log_formats``): rules load with
errors that name the file, the format, the rule and the field; numbers as
frameworks print them; NaN/inf kept; colours and carriage returns removed;
``auto`` detection; lines no rule reads are skipped; and the CLI's
``lens parse``. The real framework lines are in test_log_format_fixtures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from libs.log_formats import Parser, clean, number
from libs.specs import SpecError

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = (" [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:        12800 |"
            " elapsed time per iteration (ms): 1234.5 | learning rate: 1.500000E-04 | global "
            "batch size:   128 | lm loss: {loss} | loss scale: 1.0 | grad norm: 1.234 | number "
            "of skipped iterations:   0 | number of nan iterations:   {nan} |")


@pytest.fixture(scope="module")
def parser() -> Parser:
    return Parser.load()


@pytest.mark.parametrize(("text", "value"), [
    ("1,234", 1234.0), ("7.123456E+00", 7.123456), ("1.5e-4", 1.5e-4), ("nan", math.nan),
    ("NaN", math.nan), ("-inf", -math.inf), ("inf", math.inf), (".5", 0.5)])
def test_numbers_as_frameworks_print_them(text: str, value: float) -> None:
    got = number(text)
    assert (math.isnan(got) and math.isnan(value)) or got == value


def test_a_nan_loss_stays_nan(parser: Parser) -> None:
    [rec] = parser.parse_lines([MEGATRON.format(loss="nan", nan=1)])
    assert rec.iteration == 100 and math.isnan(rec.values["loss"])
    assert rec.values["nan_iterations"] == 1 and rec.as_dict()["loss"] == "nan"
    [rec] = parser.parse_lines([MEGATRON.format(loss="7.1E+00", nan=0)])
    assert rec.values["loss"] == 7.1 and rec.values["step_time_s"] == pytest.approx(1.2345)


def test_colours_and_redrawn_progress_bars_are_cleaned() -> None:
    assert clean("\x1b[31mstep:  1\x1b[39m  loss: 2\n") == "step:  1  loss: 2"
    assert clean("Epoch 0:   1%|a\rEpoch 0:   2%|b\r\n") == "Epoch 0:   2%|b"


def test_auto_detects_and_unknown_lines_are_skipped(parser: Parser) -> None:
    lines = ["warning: something", MEGATRON.format(loss="2.0", nan=0), "", "\x00\x01binary"]
    assert parser.detect(lines) == "megatron"
    assert [r.line_no for r in parser.parse_lines(lines)] == [2]
    assert parser.detect(["hello", "world"]) is None
    assert parser.parse_lines(["hello"]) == []
    with pytest.raises(KeyError, match="unknown log format 'nope'"):
        parser.parse_lines(["x"], "nope")


def test_a_format_that_extends_another_wins_on_its_own_lines(parser: Parser) -> None:
    primus = MEGATRON.format(loss="2.0", nan=0).replace(
        "| lm loss", "| throughput per GPU (TFLOP/s/GPU): 401.2 | tokens per GPU "
                     "(tokens/s/GPU): 9876.5 | lm loss")
    assert parser.detect([primus]) == "primus"
    assert parser.detect([MEGATRON.format(loss="2.0", nan=0)]) == "megatron"
    [rec] = parser.parse_lines([primus])
    assert (rec.values["tflops"], rec.values["tokens_per_s"]) == (401.2, 9876.5)


@pytest.mark.parametrize(("body", "says"), [
    ("formats: {x: {detect: ['a'], rules: [{name: r, match: '(unclosed'}]}}",
     "field 'formats.x.rules.0.match'"),
    ("formats: {x: {detect: ['a'], rules: [{name: r, match: 'a', fields: {loss: "
     "{pattern: 'no group'}}}]}}", "captures nothing"),
    ("formats: {x: {detect: ['a'], rules: [{name: r, match: 'a', fields: {speed: "
     "{pattern: '(1)'}}}]}}", "unknown field(s) speed"),
    ("formats: {x: {detect: [], rules: [{name: r, match: 'a'}]}}", "formats.x.detect"),
    ("formats: {x: {detect: ['a'], rules: [{name: r, match: a}, {name: r, match: b}]}}",
     "rule names must be unique"),
    ("formats: {x: {detect: ['a'], rules: [{name: r, match: 'a', kind: metric}]}}",
     "formats.x.rules.0.kind"),
])
def test_a_malformed_rule_fails_at_load_naming_file_rule_and_field(
        tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(body + "\n")
    with pytest.raises(SpecError) as err:
        Parser.load(path)
    text = str(err.value)
    assert str(path) in text and says in text and "line 1" in text, text


def test_an_extra_file_adds_a_format(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("formats:\n  mine:\n    detect: ['^it \\d+ ']\n    rules:\n"
                    "      - {name: p, match: '^it (?P<iteration>\\d+) ', fields: "
                    "{loss: {pattern: 'l=({num})'}, step_time_s: {pattern: '({num})it/s', "
                    "invert: true}}}\n")
    parser = Parser.load(path)
    assert "megatron" in parser.names and "mine" in parser.names
    [rec] = parser.parse_lines(["it 7 l=0.5 4it/s"])
    assert (rec.format, rec.iteration, rec.values) == (
        "mine", 7, {"loss": 0.5, "step_time_s": 0.25})


def test_lens_parse_cli(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(MEGATRON.format(loss="3.5", nan=0).encode() + b"\n\xff\xfe not utf-8\n")
    cmd = [sys.executable, "-m", "cli.main", "lens", "parse", str(log)]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["format"] == "megatron" and doc["records"][0]["loss"] == 3.5
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "format: megatron; 1 of 2 line(s) carry telemetry" in out.stdout
    assert "line 1: kind=progress iteration=100 loss=3.5" in out.stdout
    out = subprocess.run([*cmd, "--format", "nope"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 1 and "unknown log format 'nope'" in out.stderr
    other = tmp_path / "other.log"
    other.write_text("hello\n")
    out = subprocess.run([sys.executable, "-m", "cli.main", "lens", "parse", str(other)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and "no known training-log format" in out.stderr


def test_lens_checkpoint_cli(tmp_path: Path) -> None:
    (tmp_path / "iter_0000200").mkdir()
    (tmp_path / "iter_0000300").mkdir()  # being written: the tracker still says 200
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("200\n")
    cmd = [sys.executable, "-m", "cli.main", "lens", "checkpoint", str(tmp_path)]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["newest"]["layout"], doc["newest"]["step"], doc["resume_step"]) == (
        "megatron", 200, 200)
    assert [f["step"] for f in doc["in_progress"]] == [300]
    empty = tmp_path / "empty"
    empty.mkdir()
    out = subprocess.run([sys.executable, "-m", "cli.main", "lens", "checkpoint", str(empty)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 1 and "no complete checkpoint" in out.stdout
