"""Hostile hosts files: one address spelled two ways, addresses no node can
have, cluster ranges in two address families, and private keys written into
the file. Each is refused naming the line, the field and the fix; nothing
inline reaches the rendered inventory; ``bootstrap plan`` refuses the same
files from the command line without a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.inventory import HostsFile, HostSpec, normal_ip
from libs.specs import SpecError, load_model
from services.bootstrap.render import render
from tests.helpers import run_cli

PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
       "-----END OPENSSH PRIVATE KEY-----\n")


def node(name: str, ip: str, extra: str = "") -> str:
    return f"  - {{name: {name}, ip: '{ip}', gpu_model: cpu, gpu_count: 1{extra}}}\n"


def refused(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_model(path, HostsFile)
    return str(err.value)


@pytest.mark.parametrize(("first", "second"), [
    ("2001:db8::1", "2001:DB8:0:0:0:0:0:0001"),
    ("fe80::1", "FE80:0000::0001"),
    ("10.0.0.1", "::ffff:10.0.0.1"),
])
def test_one_address_spelled_two_ways_is_a_duplicate(tmp_path: Path, first: str,
                                                      second: str) -> None:
    text = refused(tmp_path, "nodes:\n" + node("a", first) + node("b", second))
    assert "line 3, field 'nodes.1.ip': duplicate node ip" in text and "also nodes.0" in text


def test_addresses_are_kept_in_normal_form() -> None:
    assert normal_ip("2001:DB8:0::1") == "2001:db8::1"
    assert normal_ip("::ffff:192.168.1.9") == "192.168.1.9"
    assert normal_ip(" 10.0.0.7 ") == "10.0.0.7"


@pytest.mark.parametrize(("ip", "why"), [
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("255.255.255.255", "broadcast"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("240.0.0.1", "reserved"),
    ("::ffff:0.0.0.0", "unspecified"),
])
def test_unusable_node_addresses_are_refused(tmp_path: Path, ip: str, why: str) -> None:
    text = refused(tmp_path, "nodes:\n" + node("a", ip))
    assert "line 2, field 'nodes.0.ip'" in text and why in text and "node's own address" in text


def test_loopback_nodes_stay_valid_for_the_embedded_stack(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("nodes:\n" + node("a", "127.0.0.2") + node("b", "::1"))
    assert [n.ip for n in load_model(path, HostsFile).nodes] == ["127.0.0.2", "::1"]


def test_cluster_ranges_in_two_families_are_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1") +
                   "kubernetes:\n  pod_cidr: 10.233.64.0/18\n  service_cidr: fd00::/108\n")
    assert "line 5, field 'kubernetes.service_cidr'" in text and "one address family" in text
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1") +
                   "kubernetes:\n  pod_cidr: 10.233.64.1/18\n")
    assert "field 'kubernetes.pod_cidr'" in text and "first address" in text


def test_an_inline_private_key_is_refused_and_not_echoed(tmp_path: Path) -> None:
    body = "".join(f"      {line}\n" for line in PEM.splitlines())
    text = refused(tmp_path, "nodes:\n  - name: a\n    ip: 10.0.0.1\n    gpu_model: cpu\n"
                   f"    gpu_count: 1\n    ssh_key: |\n{body}")
    assert "line 6, field 'nodes.0.ssh_key'" in text and "secret:NAME" in text
    assert "b3BlbnNz" not in text  # the key itself never reaches a terminal or a log
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1", ", labels: {k: '" +
                                              PEM.splitlines()[0] + "'}"))
    assert "field 'nodes.0.labels'" in text and "private key" in text


def test_key_references_render_as_a_path_or_a_secret_name(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("nodes:\n" + node("a", "10.0.0.1", ", ssh_key: /etc/primus/ssh/id")
                    + node("b", "10.0.0.2", ", ssh_key: 'secret:node-keys'"))
    inventory = render(load_model(path, HostsFile))["inventory/local/hosts.yaml"]
    assert "ansible_ssh_private_key_file: /etc/primus/ssh/id" in inventory
    assert "primus_ssh_key_secret: node-keys" in inventory
    assert "neither a file path" in refused(tmp_path, "nodes:\n" + node(
        "a", "10.0.0.1", ", ssh_key: 'not a path'"))


def test_render_refuses_key_material_even_from_an_unvalidated_model() -> None:
    host = HostSpec.model_construct(name="a", ip="10.0.0.1", roles=["worker"], labels={},
                                    gpu_model="cpu", gpu_count=1, ssh_user=None, ssh_key=PEM)
    hosts = HostsFile.model_construct(cluster="c", provision=False, kubernetes=None,
                                      nodes=[host])
    with pytest.raises(ValueError, match="private key"):
        render(hosts)


def test_bootstrap_plan_refuses_each_bad_file_cleanly(tmp_path: Path) -> None:
    bad = {
        "dup-v6.yaml": ("nodes:\n" + node("a", "2001:db8::1") + node("b", "2001:db8:0::1"),
                        "line 3, field 'nodes.1.ip'"),
        "zero.yaml": ("nodes:\n" + node("a", "0.0.0.0"), "line 2, field 'nodes.0.ip'"),
        "key.yaml": ("nodes:\n  - name: a\n    ip: 10.0.0.1\n    gpu_model: cpu\n"
                     "    gpu_count: 1\n    ssh_key: |\n" + "".join(
                         f"      {line}\n" for line in PEM.splitlines()),
                     "line 6, field 'nodes.0.ssh_key'"),
        "dupkey.yaml": ("cluster: a\ncluster: b\nnodes:\n" + node("a", "10.0.0.1"),
                        "line 2, field 'cluster': duplicate key (first at line 1)"),
        "bomb.yaml": ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "nodes:\n" +
            node("a", "10.0.0.1"), "aliases (*name) expand the file"),
    }
    env = {**os.environ, "PRIMUS_NATS_URL": "nats://127.0.0.1:1"}
    for name, (content, expected) in bad.items():
        path = tmp_path / name
        path.write_text(content)
        proc = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                       env=env, timeout=30)
        assert proc.returncode == 1, (name, proc.stderr)
        assert str(path) in proc.stderr and expected in proc.stderr, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stdout == "", (name, proc.stdout)
    assert not (tmp_path / "out").exists()  # refused before any file is written


def test_labels_and_ssh_users_follow_the_rules_they_are_rendered_under(tmp_path: Path) -> None:
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1", ", labels: {rack: 'r 1'}"))
    assert "field 'nodes.0.labels'" in text and "Kubernetes label value" in text
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1", ", labels: {'a/b': r1}"))
    assert "Kubernetes label name" in text
    big = "{" + ", ".join(f"k{i}: v" for i in range(65)) + "}"
    assert "at most 64" in refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1",
                                                                f", labels: {big}"))
    text = refused(tmp_path, "nodes:\n" + node("a", "10.0.0.1", ", ssh_user: 'root; rm -rf'"))
    assert "field 'nodes.0.ssh_user'" in text
