"""The hosts file: every problem at once with its path and line, provisioning
checks only when provisioning is asked for, and a published JSON Schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.inventory import HostsFile, local_hosts, render_hosts_schema
from libs.specs import SpecError, load_model
from services.bootstrap.hosts_schema import PATH as SCHEMA_PATH
from tests.helpers import ROOT

BAD = """\
cluster: lab
provision: true
kubernetes:
  pod_cidr: 10.0.0.0/16
  service_cidr: 10.0.128.0/20
nodes:
  - {name: a, ip: 10.1.0.1, roles: [etcd, worker], gpu_model: MI300X, gpu_count: 8}
  - {name: a, ip: 10.1.0.2, roles: [etcd, worker], gpu_model: MI300X, gpu_count: 8}
  - {name: c, ip: 10.1.0.2, roles: [worker], gpu_model: TPU9, gpu_count: 8}
"""


def test_every_problem_is_reported_at_once_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(BAD)
    with pytest.raises(SpecError) as err:
        load_model(path, HostsFile)
    text = str(err.value)
    # field errors come first (the model checks run only on valid fields)
    assert "line 9, field 'nodes.2.gpu_model'" in text and "unknown GPU model 'TPU9'" in text
    path.write_text(BAD.replace("TPU9", "MI300X"))
    with pytest.raises(SpecError) as err:
        load_model(path, HostsFile)
    text = str(err.value)
    assert "5 problem(s)" in text
    assert "line 8, field 'nodes.1.name': duplicate node name 'a'" in text
    assert "line 9, field 'nodes.2.ip': duplicate node ip '10.1.0.2'" in text
    assert "no node has the role control-plane" in text and "provision: true" in text
    assert "2 etcd member(s): etcd needs an odd number" in text
    assert "line 5, field 'kubernetes.service_cidr'" in text and "overlaps pod_cidr" in text


@pytest.mark.parametrize("text", [
    "nodes:\n  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}\n",
    "provision: false\nnodes:\n  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}\n",
])
def test_worker_only_files_are_fine_when_nothing_is_provisioned(
        tmp_path: Path, text: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    assert not load_model(path, HostsFile).provisioned


def test_a_kubernetes_section_alone_asks_for_provisioning(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("kubernetes: {}\n"
                    "nodes:\n  - {name: a, ip: 10.0.0.1, gpu_model: cpu, gpu_count: 1}\n")
    with pytest.raises(SpecError, match="no node has the role control-plane"):
        load_model(path, HostsFile)


def test_a_node_inside_the_pod_range_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("provision: true\nnodes:\n"
                    "  - {name: a, ip: 10.233.64.9, roles: [control-plane, etcd, worker],"
                    " gpu_model: cpu, gpu_count: 0}\n")
    with pytest.raises(SpecError, match=r"field 'nodes.0.ip': 10.233.64.9 lies inside pod_cidr"):
        load_model(path, HostsFile)


def test_embedded_hosts_stay_valid() -> None:
    assert len(local_hosts(8).nodes) == 8
    hosts = load_model(ROOT / "examples" / "hosts.yaml", HostsFile)
    assert not hosts.provisioned and len(hosts.nodes) == 4


def test_published_json_schema_matches_the_model() -> None:
    assert SCHEMA_PATH.read_text() == render_hosts_schema(), (
        "run `python -m services.bootstrap.hosts_schema`")
    assert "ssh_key" in SCHEMA_PATH.read_text() and "KubernetesSettings" in SCHEMA_PATH.read_text()
