"""The chart's NetworkPolicies, evaluated: who may reach which pod on which port.

The rendered policies are run through a small evaluator of the Kubernetes
NetworkPolicy rules (a pod selected by any Ingress policy accepts only what
one of their rules allows; peers are pod selectors in the policy's
namespace, namespace selectors, both at once, or ipBlocks; selectors with
matchLabels and matchExpressions). The sources are the pods the chart itself
renders, a worker pod built by the Kubernetes driver's own manifest code
(libs/drivers/k8s_manifests.py), a Grafana pod in another namespace and a
stranger. Every policy also validates strictly (test_deploy_helm covers all
scenarios); here the question is what they mean.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

import pytest
from deploy_helpers import NAMESPACE, Renderer, by_kind
from scenarios import SCENARIOS

from libs.drivers.k8s_manifests import KubernetesDriverConfig, gang_manifests
from libs.events import JobSpec, WorkerSlot

SERVICES = ("bootstrap", "scheduler", "lens-collector", "failover", "bench-coordinator")


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ip: str = "10.244.1.10"
    namespace_labels: dict[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector against labels. Pure."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def peer_admits(peer: dict[str, Any], policy_ns: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        address = ipaddress.ip_address(source.ip)
        block = peer["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(cidr) for cidr in block.get("except", [])
        )
    if "namespaceSelector" in peer:
        if not matches(peer["namespaceSelector"], source.ns_labels()):
            return False
    elif source.namespace != policy_ns:
        return False
    return matches(peer.get("podSelector", {}), source.labels)


def port_admits(ports: list[dict[str, Any]] | None, port: int) -> bool:
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == "TCP" and p["port"] <= port <= p.get("endPort", p["port"])
        for p in ports
    )


def allowed(policies: list[dict[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    """Whether source may open a TCP connection to target:port. Pure."""
    selecting = [
        p for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and matches(p["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True
    return any(
        (not rule.get("from")
         or any(peer_admits(peer, p["metadata"]["namespace"], source) for peer in rule["from"]))
        and port_admits(rule.get("ports"), port)
        for p in selecting
        for rule in p["spec"].get("ingress", [])
    )


# ---------------------------------------------------------------- pods ---


def chart_pods(objects: list[dict[str, Any]]) -> dict[str, Pod]:
    """One pod per rendered workload, by component, with its template's labels."""
    pods = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            pods[labels["app.kubernetes.io/component"]] = Pod(
                obj["metadata"]["name"], obj["metadata"]["namespace"], labels)
    return pods


def worker_pod() -> Pod:
    """A training pod exactly as the Kubernetes driver makes it, in the
    release namespace (the chart sets PRIMUS_K8S_NAMESPACE to it)."""
    config = KubernetesDriverConfig(namespace=NAMESPACE, image="primus-safe-agent-rocm:0.1.0")
    spec = JobSpec(name="tiny", workers=1, gpus_per_worker=8, command=["python", "train.py"])
    _, (pod,) = gang_manifests("Tiny_Job", 1, spec, [WorkerSlot(rank=0, node="gpu-01", gpus=8)],
                               config=config, nats_url="nats://nats:4222")
    return Pod(pod["metadata"]["name"], pod["metadata"]["namespace"], pod["metadata"]["labels"])


GRAFANA = Pod("grafana-0", "monitoring", {"app.kubernetes.io/name": "grafana"})
STRANGER = Pod("curl", NAMESPACE, {"run": "curl"})
OUTSIDER = Pod("curl", "default", {"run": "curl"})


def policies_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return list(by_kind(objects, "NetworkPolicy").values())


# --------------------------------------------------------------- tests ---


def test_default_deny_covers_every_pod_of_the_release(render: Renderer) -> None:
    objects = render()
    policies = policies_of(objects)
    pods = chart_pods(objects)
    assert set(pods) >= {*SERVICES, "bench-agent", "nats", "clickhouse"}
    (deny,) = [p for p in policies if p["metadata"]["name"].endswith("-default-deny")]
    assert "ingress" not in deny["spec"] and deny["spec"]["policyTypes"] == ["Ingress"]
    for name, pod in pods.items():
        assert matches(deny["spec"]["podSelector"], pod.labels), name
    # Training pods are the jobs' own business (their rendezvous port is
    # reached by their peers): the release's policies leave them alone.
    assert not matches(deny["spec"]["podSelector"], worker_pod().labels)
    assert allowed(policies, worker_pod(), worker_pod(), 29500)


def test_services_accept_nothing(render: Renderer) -> None:
    objects = render()
    policies = policies_of(objects)
    pods = chart_pods(objects)
    sources = [*pods.values(), worker_pod(), GRAFANA, STRANGER, OUTSIDER]
    for verb in SERVICES:
        for source in sources:
            for port in (80, 4222, 8080, 8123):
                assert not allowed(policies, source, pods[verb], port), (source.name, verb, port)


def test_nats_clients_are_the_platform_and_the_training_pods(render: Renderer) -> None:
    objects = render()
    policies = policies_of(objects)
    pods = chart_pods(objects)
    nats = pods["nats"]
    for verb in (*SERVICES, "bench-agent"):
        assert allowed(policies, pods[verb], nats, 4222), verb
    assert allowed(policies, worker_pod(), nats, 4222)
    for stranger in (STRANGER, OUTSIDER, GRAFANA):
        assert not allowed(policies, stranger, nats, 4222), stranger
    # Only the client port: not the monitor port, not routes (no cluster).
    assert not allowed(policies, pods["scheduler"], nats, 8222)
    assert not allowed(policies, nats, nats, 6222)


def test_nats_cluster_routes_only_between_peers(render: Renderer) -> None:
    values = SCENARIOS["nats-cluster"]
    objects = render(values)
    policies = policies_of(objects)
    pods = chart_pods(objects)
    nats = pods["nats"]
    peer = Pod("primus-primus-safe-nats-1", NAMESPACE, nats.labels, ip="10.244.2.7")
    assert allowed(policies, peer, nats, 6222)
    for other in (pods["scheduler"], worker_pod(), STRANGER):
        assert not allowed(policies, other, nats, 6222), other.name
    # extraFrom: host-network agents come from the node addresses.
    node = Pod("gpu-01", "host", {}, ip="10.0.3.4")
    assert allowed(policies, node, nats, 4222)
    assert not allowed(policies, Pod("far", "host", {}, ip="192.168.0.1"), nats, 4222)


def test_clickhouse_clients_are_the_collector_and_grafana(render: Renderer) -> None:
    objects = render()
    policies = policies_of(objects)
    pods = chart_pods(objects)
    clickhouse = pods["clickhouse"]
    for port in (8123, 9000):
        assert allowed(policies, pods["lens-collector"], clickhouse, port)
        assert allowed(policies, GRAFANA, clickhouse, port)
    # Exactly the services that hold a ClickHouse DSN may reach ClickHouse.
    with_dsn = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in by_kind(objects, "Deployment").values()
        if any(e["name"] == "PRIMUS_CLICKHOUSE_DSN"
               for e in o["spec"]["template"]["spec"]["containers"][0]["env"])
    }
    assert with_dsn == {"lens-collector"}
    assert {v for v in SERVICES if allowed(policies, pods[v], clickhouse, 8123)} == with_dsn
    others = [pods[v] for v in SERVICES if v != "lens-collector"]
    for other in (*others, pods["bench-agent"], pods["nats"], worker_pod(), STRANGER, OUTSIDER):
        assert not allowed(policies, other, clickhouse, 8123), other.name
    # Grafana where the operator says it is, and nowhere else.
    scoped = policies_of(render(SCENARIOS["nats-cluster"]))
    assert allowed(scoped, GRAFANA, clickhouse, 8123)
    elsewhere = Pod("grafana-0", "tools", {"app.kubernetes.io/name": "grafana"})
    assert not allowed(scoped, elsewhere, clickhouse, 8123)


def test_agents_reach_each_other_for_multinode_benchmarks(render: Renderer) -> None:
    objects = render()
    policies = policies_of(objects)
    pods = chart_pods(objects)
    agent = pods["bench-agent"]
    other = Pod("bench-agent-xyz", NAMESPACE, agent.labels, ip="10.244.9.9")
    assert allowed(policies, other, agent, 29600)
    assert not allowed(policies, pods["scheduler"], agent, 29600)
    assert not allowed(policies, worker_pod(), agent, 29600)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"networkPolicy": {"enabled": False}}, set()),
        (SCENARIOS["external-services"], {"default-deny", "bench-agent", "metrics"}),
        ({}, {"default-deny", "nats", "clickhouse", "bench-agent", "metrics"}),
    ],
    ids=["off", "external", "defaults"],
)
def test_policies_follow_what_is_bundled(
    render: Renderer, values: dict[str, Any], expected: set[str]
) -> None:
    names = {n.removeprefix("primus-primus-safe-") for n in by_kind(render(values),
                                                                   "NetworkPolicy")}
    assert names == expected
