"""Hostile job files fail with one clear error naming the file, the line and
the field and the fix, in bounded time and memory: odd job names, non-UTF-8
bytes, deep nesting, alias bombs, duplicate keys, oversized values and files.
The CLI cases run ``primus-safe submit`` as a user would: exit non-zero,
stderr names the problem, no traceback, nothing on stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libs import yaml_files
from libs.events import MAX_SPEC_BYTES, JobSpec
from libs.specs import SpecError, load_model
from tests.helpers import run_cli

JOB = "name: {name}\nworkers: 1\ncommand: [python, train.py]\n"


def refused(tmp_path: Path, content: str | bytes, name: str = "job.yaml") -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecError) as err:
        load_model(path, JobSpec)
    text = str(err.value)
    assert text.startswith(str(path))
    return text


@pytest.mark.parametrize("name", ["a/b", "a.b", "a b", "a>b", "a*", "Train", "train_1", "-x",
                                  "x-", "tr\N{ROCKET}in", "x" * 64, "''"])
def test_job_names_follow_the_rfc1123_label_rule(tmp_path: Path, name: str) -> None:
    text = refused(tmp_path, JOB.format(name=f'"{name}"' if name != "''" else name))
    assert "line 1, field 'name'" in text and "RFC 1123" in text and "at most 63" in text


@pytest.mark.parametrize("name", ["a", "x" * 63, "llama-70b-pretrain", "0-9"])
def test_good_job_names_load(tmp_path: Path, name: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name=name))
    assert load_model(path, JobSpec).name == name


def test_utf16_latin1_and_binary_files_are_named(tmp_path: Path) -> None:
    text = refused(tmp_path, JOB.format(name="x").encode("utf-16"))
    assert "UTF-16" in text and "save it as UTF-8" in text
    text = refused(tmp_path, ("workers: 1\ncommand: [a]\nname: caf\xe9\n").encode("latin-1"))
    assert "line 3" in text and "0xe9 is not UTF-8" in text and "save it as UTF-8" in text
    text = refused(tmp_path, b"name: x\nworkers: 1\x00\x01\x02\ncommand: [a]\n")
    assert "line 2" in text and "binary" in text


def test_excessive_nesting_is_refused_with_the_line(tmp_path: Path) -> None:
    deep = JOB.format(name="x") + "env: " + "[" * 5000 + "]" * 5000 + "\n"
    text = refused(tmp_path, deep)
    assert "line 4" in text and "nested more than" in text
    block = JOB.format(name="x") + "".join("  " * i + f"k{i}:\n" for i in range(40))
    assert "nested more than" in refused(tmp_path, block)


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                       strict=True))
    text = refused(tmp_path, JOB.format(name="x") + bomb)
    assert "aliases" in text and "over the limit" in text
    many = "a: &a [1]\nb: [" + ", ".join(["*a"] * (yaml_files.MAX_ALIASES + 1)) + "]\n"
    assert "alias uses" in refused(tmp_path, JOB.format(name="x") + many)
    assert "contains it" in refused(tmp_path, JOB.format(name="x") + "a: &a [1, *a]\n")


def test_a_few_anchors_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: x\nworkers: 1\nenv: &e {A: '1'}\n"
                    "command: [python, t.py]\n<<: {env: *e}\n")
    assert load_model(path, JobSpec).env == {"A": "1"}


def test_duplicate_keys_name_both_lines(tmp_path: Path) -> None:
    text = refused(tmp_path, "name: x\nworkers: 1\ncommand: [a]\nenv:\n  A: '1'\n  A: '2'\n"
                   "workers: 2\n")
    assert "line 7, field 'workers': duplicate key (first at line 2)" in text
    assert "line 6, field 'env.A': duplicate key (first at line 5)" in text


def test_an_env_too_large_for_one_message_names_the_limit(tmp_path: Path) -> None:
    big = "x" * (MAX_SPEC_BYTES + 1)
    text = refused(tmp_path, JOB.format(name="x") + f"env:\n  BIG: {big}\n")
    assert "line 4, field 'env'" in text and "NATS message" in text and "KiB" in text


def test_bad_env_names_and_nul_bytes(tmp_path: Path) -> None:
    assert "field 'env'" in refused(tmp_path, JOB.format(name="x") + "env: {'A=B': '1'}\n")
    text = refused(tmp_path, 'name: x\nworkers: 1\ncommand: ["a\\0b"]\n')
    assert "field 'command'" in text and "NUL" in text
    assert "field 'min_runtime_s'" in refused(tmp_path, JOB.format(name="x") +
                                              "min_runtime_s: .nan\n")


def test_files_above_the_size_limit_are_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    with path.open("wb") as f:  # sparse: costs no disk, and is never read whole
        f.truncate(yaml_files.MAX_BYTES + 10)
    with pytest.raises(SpecError, match="larger than the 8.0 MiB limit"):
        load_model(path, JobSpec)


def test_timestamps_stay_text_and_the_c_loader_is_used(tmp_path: Path) -> None:
    assert yaml_files.LIBYAML  # the wheel ships libyaml; the 10,000-node plan depends on it
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name="x") + "env: {SINCE: 2024-01-01}\n")
    assert load_model(path, JobSpec).env == {"SINCE": "2024-01-01"}


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "slash.yaml": (b"name: a/b\nworkers: 1\ncommand: [a]\n", "line 1, field 'name'"),
    "long.yaml": (b"name: " + b"x" * 64 + b"\nworkers: 1\ncommand: [a]\n", "field 'name'"),
    "latin1.yaml": ("name: caf\xe9\n".encode("latin-1"), "line 1: byte 0xe9"),
    "utf16.yaml": ("name: x\n".encode("utf-16"), "save it as UTF-8"),
    "deep.yaml": (b"name: x\nenv: " + b"[" * 2000 + b"]" * 2000, "line 2"),
    "bomb.yaml": (b"name: x\na: &a [x,x,x,x,x,x,x,x,x,x]\n" + b"".join(
        f"{c}: &{c} [{','.join([f'*{p}'] * 10)}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)), "aliases"),
    "dup.yaml": (b"name: x\nworkers: 1\ncommand: [a]\nname: y\n",
                 "line 4, field 'name': duplicate key (first at line 1)"),
    "env.yaml": (b"name: x\nworkers: 1\ncommand: [a]\nenv: {BIG: " + b"x" * (MAX_SPEC_BYTES + 9)
                 + b"}\n", "line 4, field 'env'"),
}


def test_submit_refuses_each_bad_file_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}  # never reached
    for name, (content, expected) in BAD_FILES.items():
        path = tmp_path / name
        path.write_bytes(content)
        proc = run_cli("submit", str(path), env=env, timeout=30)
        assert proc.returncode == 1, (name, proc.stderr)
        assert str(path) in proc.stderr and expected in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == "", (name, proc.stdout)


def test_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    # plan on many nodes prints far more than a pipe holds; head stops after a line
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("nodes:\n" + "".join(
        f"  - {{name: n{i}, ip: 10.0.{i // 250}.{i % 250 + 1}, gpu_model: cpu, gpu_count: 1}}\n"
        for i in range(3000)))
    env = {**os.environ, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}
    exe = Path(sys.executable).parent / "primus-safe"
    proc = subprocess.run(
        f"'{exe}' bootstrap plan '{hosts}' --json --out '{tmp_path / 'out'}' | head -n 1; "
        "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", env=env,
        capture_output=True, text=True, timeout=60)
    assert proc.stdout == "{\n"
    assert proc.returncode in (0, 141) and "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipe" not in proc.stderr


@pytest.mark.parametrize("argv", [("explain", "a.b"), ("bench", "run", "--node", "a>b"),
                                  ("bench-agent", "--node", "x y")])
def test_bad_names_on_the_command_line_are_user_errors(argv: tuple[str, ...]) -> None:
    env = {**os.environ, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}
    proc = run_cli(*argv, env=env, timeout=30)
    assert proc.returncode == 1 and "is not a valid name" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(("argv", "says"), [
    (("stop", "j1", "--timeout", "0"), "--timeout 0: write a positive number of seconds"),
    (("resume", "j1", "--timeout", "-5"), "--timeout -5: write a positive number of seconds"),
    (("cancel", "j1", "--timeout", "soon"), "invalid float value: 'soon'"),
    (("delete", "a.b"), "is not a valid name"),
])
def test_malformed_job_verb_flags_are_one_line_and_touch_nothing(
        argv: tuple[str, ...], says: str) -> None:
    env = {**os.environ, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}  # nothing listens there
    proc = run_cli(*argv, env=env, timeout=30)
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
