"""Kubespray's own inventory rules, over inventories the renderer writes.

The rules are those of the supported releases' ``validate_inventory`` role
and preinstall ``0040-verify-settings.yml``, vendored under
``fixtures/kubespray/<tag>/`` (origin in each file's header). Every task
there is either encoded in ``libs.kubespray.inventory_problems`` (and a
broken inventory here shows that it fires) or named below with why the
renderer cannot break it; a release whose rules change fails the coverage
test until the new rule is sorted. Then every hosts file the model accepts
for a release renders an inventory that release accepts (property test).
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from libs.inventory import HostsFile
from libs.kubespray import RELEASES, KubesprayRelease, inventory_problems, release_for
from services.bootstrap.render import kubespray_refusals, render

FIXTURES = Path(__file__).parent / "fixtures" / "kubespray"
TAGS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())

Inventory = dict[str, Any]
Variables = dict[str, Any]


def _drop_group(name: str) -> Callable[[Inventory, Variables], None]:
    def change(inv: Inventory, _: Variables) -> None:
        inv["all"]["children"][name]["hosts"] = {}
    return change


def _set(**values: Any) -> Callable[[Inventory, Variables], None]:
    def change(_: Inventory, var: Variables) -> None:
        var.update(values)
    return change


def _even_etcd(inv: Inventory, _: Variables) -> None:
    inv["all"]["children"]["etcd"]["hosts"]["gpu-1"] = None


def _bad_host(inv: Inventory, _: Variables) -> None:
    inv["all"]["hosts"]["GPU_004"] = {"ansible_host": "10.0.0.99"}


def _many_nodes(inv: Inventory, var: Variables) -> None:
    for i in range(70):
        inv["all"]["children"]["kube_node"]["hosts"][f"w-{i}"] = None
    var["kube_network_plugin"] = "cilium"


def _ipv6_too_small(inv: Inventory, var: Variables) -> None:
    _many_nodes(inv, var)
    var.update(ipv4_stack=False, ipv6_stack=True, kube_pods_subnet_ipv6="fd00::/114",
               kube_service_addresses_ipv6="fd01::/112")


# Rule (its task name, up to " (") -> a change of a valid inventory that breaks it.
ENCODED: dict[str, Callable[[Inventory, Variables], None]] = {
    "Fail if removed variables are used": _set(kubelet_static_pod_path="/etc/k8s"),
    "Stop if kube_control_plane group is empty": _drop_group("kube_control_plane"),
    "Stop if etcd group is empty in external etcd mode": _drop_group("etcd"),
    "Stop if unsupported version of Kubernetes": _set(kube_version="1.20.0"),
    "Stop if known booleans are set as strings": _set(helm_enabled="true"),
    "Stop if even number of etcd hosts": _even_etcd,
    "Guarantee that enough network address space is available for all pods": _set(
        kube_network_plugin="cilium", kube_network_node_prefix=26),
    "Check that kube_service_addresses is a network range": _set(
        kube_service_addresses="10.233.0.1/33"),
    "Check that kube_pods_subnet is a network range": _set(kube_pods_subnet="pods"),
    "Check that kube_pods_subnet does not collide with kube_service_addresses": _set(
        kube_service_addresses="10.233.64.0/20"),
    "Check that ipv4 IP range is enough for the nodes": _many_nodes,
    "Check that kube_service_addresses_ipv6 is a network range": _set(
        ipv6_stack=True, kube_pods_subnet_ipv6="fd00::/112", kube_service_addresses_ipv6="x"),
    "Check that kube_pods_subnet_ipv6 is a network range": _set(
        ipv6_stack=True, kube_pods_subnet_ipv6="10.0.0.0/8",
        kube_service_addresses_ipv6="fd01::/112"),
    "Check that kube_pods_subnet_ipv6 does not collide with kube_service_addresses_ipv6": _set(
        ipv6_stack=True, kube_pods_subnet_ipv6="fd00::/64",
        kube_service_addresses_ipv6="fd00::/112"),
    "Check that ipv6 IP range is enough for the nodes": _ipv6_too_small,
    "Stop if unsupported options selected": _set(kube_network_plugin="weave"),
    "Download_file | Check if requested Kubernetes are supported": _set(kube_version="v1.34.3"),
    "Stop if bad hostname": _bad_host,
}

# Rules the renderer cannot break, and why.
RULED_OUT = {
    "Warn if `kube_network_plugin` is `none": "a warning; the hosts file offers no 'none'",
    "Warn if `kube_network_plugin` is `none`": "a warning; the hosts file offers no 'none'",
    "Stop if RBAC is not enabled when dashboard is enabled": "dashboard is never enabled",
    "Check cloud_provider value": "no cloud_provider is rendered",
    "Check external_cloud_provider value": "no cloud_provider is rendered",
    "Warn if `enable_dual_stack_networks` is set": "never rendered (ipv4/ipv6_stack are)",
    "Stop if download_localhost is enabled but download_run_once is not": "never rendered",
    "Stop if kata_containers_enabled is enabled when container_manager is docker":
        "never rendered",
    "Stop if gvisor_enabled is enabled when container_manager is not containerd":
        "never rendered",
    "Ensure minimum containerd version": "containerd_version is the release's own default",
    "Stop if auto_renew_certificates is enabled when certificates are managed externally":
        "neither is rendered",
    # Preinstall checks of the machines themselves: the facts of a node, not
    # the inventory's; a node failing them fails its play (and its preflight).
    "Stop if any host not in '--limit' does not have a fact cache":
        "apply runs facts.yml for all hosts before a limited scale.yml (test_bootstrap_steps)",
    "Stop if non systemd OS type": "a fact of the machine",
    "Stop if the os does not support": "a fact of the machine",
    "Stop if memory is too small for control plane nodes": "a fact of the machine",
    "Stop if memory is too small for nodes": "a fact of the machine",
    "Stop if cgroups are not enabled on nodes": "a fact of the machine",
    "Stop if ip var does not match local ips": "the machine must hold the hosts file's ip",
    "Stop if access_ip is not pingable": "reachability of the machine",
    "Stop if kernel version is too low for cilium": "a fact of the machine",
    "Stop if kernel version is too low for nftables": "kube_proxy_mode is never rendered",
    "Stop if /etc/resolv.conf has no configured nameservers": "a fact of the machine",
    "Stop if download_localhost is enabled for Flatcar Container Linux": "never rendered",
}


def _key(name: str) -> str:
    return name.split(" (")[0]


def _task_names(tag: str) -> list[str]:
    names = []
    for file in sorted((FIXTURES / tag).glob("*.yml")):
        names += [_key(task["name"]) for task in yaml.safe_load(file.read_text())]
    return names


@pytest.mark.parametrize("tag", TAGS)
def test_every_rule_of_the_pinned_releases_is_encoded_or_ruled_out(tag: str) -> None:
    assert release_for(tag).series in RELEASES  # the fixtures are of supported releases
    unsorted = [n for n in _task_names(tag) if n not in ENCODED and n not in RULED_OUT]
    assert not unsorted, f"Kubespray {tag} has rules this project does not know: {unsorted}"


def test_the_fixtures_cover_every_supported_release() -> None:
    assert {release_for(t).series for t in TAGS} == set(RELEASES)


LAB = {"cluster": "lab", "provision": True, "nodes": [
    {"name": "cp-1", "ip": "10.0.0.1", "roles": ["control-plane", "etcd"], "gpu_model": "cpu",
     "gpu_count": 0},
    {"name": "gpu-1", "ip": "10.0.0.11", "gpu_model": "MI300X", "gpu_count": 8},
    {"name": "gpu-2", "ip": "10.0.0.12", "gpu_model": "MI300X", "gpu_count": 8}]}


def _rendered(release: KubesprayRelease) -> tuple[Inventory, Variables]:
    files = render(HostsFile.model_validate(LAB, context={"kubespray": release}), release)
    variables: Variables = {}
    for path, text in files.items():
        if "/group_vars/" in path:
            variables |= yaml.safe_load(text)
    return yaml.safe_load(files["inventory/lab/hosts.yaml"]), variables


# Each release with each encoded rule it has (v2.30 has no removed variables yet).
PAIRS = [(release_for(tag).series, rule) for tag in TAGS
         for rule in sorted(ENCODED) if rule in _task_names(tag)]


@pytest.mark.parametrize(("series", "rule"), PAIRS)
def test_each_encoded_rule_fires_on_an_inventory_that_breaks_it(series: str, rule: str) -> None:
    release = RELEASES[series]
    inventory, variables = _rendered(release)
    assert inventory_problems(release, inventory, variables) == []
    broken_inv, broken_vars = copy.deepcopy(inventory), copy.deepcopy(variables)
    ENCODED[rule](broken_inv, broken_vars)
    found = inventory_problems(release, broken_inv, broken_vars)
    assert any(p.startswith(rule) for p in found), found


# ---------------------------------------------------------------- property test


@st.composite
def hosts_files(draw: st.DrawFn) -> dict[str, Any]:
    """Hosts files of every shape the model describes, many of them invalid."""
    count = draw(st.integers(1, 90))
    etcd = draw(st.sampled_from([1, 2, 3, 5]))
    control = draw(st.sampled_from([0, 1, 1, 2, 3]))
    v6 = draw(st.booleans())
    pods_prefix = draw(st.integers(104, 116) if v6 else st.integers(12, 24))
    node_prefix = draw(st.none() | (st.integers(112, 124) if v6 else st.integers(20, 28)))
    nodes = []
    for i in range(count):
        roles = (["control-plane"] if i < control else []) + (["etcd"] if i < etcd else [])
        if i >= control or draw(st.booleans()):
            roles.append("worker")
        nodes.append({"name": f"n-{i}", "ip": f"10.1.{i // 250}.{i % 250 + 1}", "roles": roles,
                      "gpu_model": "MI300X", "gpu_count": 8})
    kubernetes: dict[str, Any] = {
        "network_plugin": draw(st.sampled_from(["calico", "cilium", "flannel", "kube-ovn"])),
        "container_runtime": draw(st.sampled_from(["containerd", "crio", "docker"])),
        "pod_cidr": f"fd00::/{pods_prefix}" if v6 else f"10.{64 if pods_prefix < 16 else 233}"
                    f".0.0/{pods_prefix}",
        "service_cidr": "fd01::/112" if v6 else "172.16.0.0/16",
        "version": draw(st.none() | st.sampled_from(
            sorted({v for r in RELEASES.values() for v in r.kube_versions} | {"1.30.4"}))),
    }
    if node_prefix is not None:
        kubernetes["node_cidr_prefix"] = node_prefix
    if draw(st.booleans()):
        kubernetes["dns_domain"] = draw(st.sampled_from(["cluster.local", "corp.internal"]))
    return {"cluster": "prop", "provision": True, "kubernetes": kubernetes, "nodes": nodes}


@pytest.mark.parametrize("series", sorted(RELEASES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=hosts_files())
def test_a_hosts_file_the_model_accepts_renders_what_kubespray_accepts(
        series: str, doc: dict[str, Any]) -> None:
    release = RELEASES[series]
    try:
        hosts = HostsFile.model_validate(doc, context={"kubespray": release})
    except ValidationError:
        return  # refused at plan time with the file's own fields
    files = render(hosts, release)
    assert kubespray_refusals(files, "prop", release) == []
    pods = ipaddress.ip_network(doc["kubernetes"]["pod_cidr"])
    if doc["kubernetes"]["network_plugin"] != "calico":
        prefix = doc["kubernetes"].get("node_cidr_prefix") or (24 if pods.version == 4 else 120)
        members = sum(1 for n in doc["nodes"] if {"control-plane", "worker"} & set(n["roles"]))
        assert 2 ** (prefix - pods.prefixlen) >= members
