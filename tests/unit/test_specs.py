"""Bad hosts and job files fail with the file, the line, the field and what
to write instead, all problems at once, and never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.events import JobSpec
from libs.inventory import HostsFile
from libs.specs import SpecError, load_model
from tests.helpers import ROOT, run_cli


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_examples_are_valid() -> None:
    hosts = load_model(ROOT / "examples" / "hosts.yaml", HostsFile)
    assert [n.name for n in hosts.nodes] == ["node-1", "node-2", "node-3", "node-4"]
    job = load_model(ROOT / "examples" / "job.yaml", JobSpec)
    assert job.workers == 2 and job.gpus_per_worker == 1


def test_hosts_errors_name_line_field_and_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", """\
nodes:
  - name: gpu-1
    ip: 10.0.0.1
    gpu_model: MI300X
    gpu_count: 8
  - name: gpu-2
    ip: 10.0.0.300
    gpu_model: Z80
    gpu_count: eight
""")
    with pytest.raises(SpecError) as err:
        load_model(path, HostsFile)
    text = str(err.value)
    assert str(path) in text and "3 problem(s)" in text
    assert "line 7, field 'nodes.1.ip'" in text and "write e.g. 10.0.0.7" in text
    assert "line 8, field 'nodes.1.gpu_model'" in text and "MI300X" in text
    assert "line 9, field 'nodes.1.gpu_count'" in text and "whole number" in text


def test_duplicate_nodes_are_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", """\
nodes:
  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}
  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}
""")
    with pytest.raises(SpecError, match="duplicate node name"):
        load_model(path, HostsFile)


def test_yaml_syntax_error_points_at_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: x\nworkers: [1\ncommand: [a]\n")
    with pytest.raises(SpecError, match=r"line \d+, column \d+: not valid YAML"):
        load_model(path, JobSpec)


def test_job_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "job.yaml", "name: x\nworkers: 0\npriority: urgent\ncomand: [a]\n")
    with pytest.raises(SpecError) as err:
        load_model(path, JobSpec)
    text = str(err.value)
    assert "line 2, field 'workers'" in text
    assert "line 3, field 'priority'" in text and "'low', 'medium' or 'high'" in text
    assert "field 'command': Field required (add it)" in text
    assert "line 4, field 'comand'" in text and "check its spelling" in text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the file"):
        load_model(tmp_path / "nope.yaml", JobSpec)


def test_cli_prints_the_problem_without_a_traceback(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write(tmp_path, "job.yaml", "name: x\nworkers: -1\ncommand: [a]\n")
    result = run_cli("submit", str(path), env=cli_env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"{path}: 1 problem(s)" in result.stderr and "line 2, field 'workers'" in result.stderr


def test_a_list_item_of_the_wrong_kind_names_its_own_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts.yaml", """\
nodes:
  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}
  - just-text
""")
    with pytest.raises(SpecError) as err:
        load_model(path, HostsFile)
    assert "line 3, field 'nodes.1'" in str(err.value) and "write a mapping" in str(err.value)
