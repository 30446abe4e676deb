"""The chart's Prometheus wiring: every service and agent exposes a port
named ``metrics`` with the scrape annotations; the optional PodMonitor and
ServiceMonitor validate strictly against the Prometheus Operator's own CRD
schemas (tests/deploy/crds, see its README) and select exactly those pods;
Prometheus (and nothing else) may reach the port through the NetworkPolicies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_helpers import Renderer, by_kind, component, main_container, workloads
from test_deploy_network import SERVICES, STRANGER, Pod, allowed, chart_pods, matches

CRDS = Path(__file__).parent / "crds"
SERVING = (*SERVICES, "bench-agent")
PROMETHEUS = Pod("prometheus-k8s-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
MONITORS = {"metrics": {"podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                        "serviceMonitor": {"enabled": True}}}


def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's v1 openAPIV3Schema, made strict the way the API server
    prunes: a field no ``properties`` names is an error (unless the schema
    keeps unknown fields)."""
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{kind.lower()}s.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields") \
                and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def test_every_service_and_agent_serves_metrics_with_scrape_annotations(
        render: Renderer) -> None:
    objects = render()
    found = workloads(objects)
    assert set(found) >= set(SERVING)
    for name in SERVING:
        workload = found[name]
        container = main_container(workload)
        ports = {p["name"]: p for p in container.get("ports", [])}
        assert ports["metrics"]["containerPort"] == 9470, name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PRIMUS_METRICS"] == "true" and env["PRIMUS_METRICS_PORT"] == "9470", name
        notes = workload["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true", name
        assert notes["prometheus.io/port"] == "9470" and notes["prometheus.io/path"] == "/metrics"
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"PodMonitor", "ServiceMonitor"}  # off by default: the CRDs may be absent


def test_metrics_off_leaves_no_port_no_annotation_no_policy(render: Renderer) -> None:
    objects = render({"metrics": {"enabled": False}})
    for name, workload in workloads(objects).items():
        container = main_container(workload)
        assert "metrics" not in {p["name"] for p in container.get("ports", [])}, name
        env = {e["name"]: e.get("value") for e in container["env"]}
        if name in SERVING:
            assert env["PRIMUS_METRICS"] == "false"
        notes = workload["spec"]["template"]["metadata"].get("annotations", {})
        assert "prometheus.io/scrape" not in notes
    assert not any(o["metadata"]["name"].endswith("-metrics") for o in objects)


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitors_validate_against_the_operators_crd(render: Renderer, kind: str) -> None:
    (monitor,) = by_kind(render(MONITORS), kind).values()
    jsonschema.validate(monitor, crd_schema(kind))
    bad = {**monitor, "spec": {**monitor["spec"], "podMetricEndpoints": []}}  # a typo
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, crd_schema(kind))


def test_the_pod_monitor_selects_the_services_and_agents_only(render: Renderer) -> None:
    objects = render(MONITORS)
    (monitor,) = by_kind(objects, "PodMonitor").values()
    assert monitor["metadata"]["labels"]["release"] == "kps"
    pods = chart_pods(objects)
    selected = {name for name, pod in pods.items()
                if matches(monitor["spec"]["selector"], pod.labels)}
    assert selected == set(SERVING)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert targets == {"service", "node"}


def test_the_service_monitor_reaches_every_metrics_port(render: Renderer) -> None:
    objects = render(MONITORS)
    (monitor,) = by_kind(objects, "ServiceMonitor").values()
    services = [o for o in objects if o["kind"] == "Service"
                and matches(monitor["spec"]["selector"], o["metadata"]["labels"])]
    (service,) = services
    assert service["spec"]["clusterIP"] == "None"
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    # Endpoints: the selected pods that have a port of that name.
    pods = {component(o): o for o in objects if o["kind"] in ("Deployment", "DaemonSet",
                                                             "StatefulSet")}
    endpoints = {name for name, workload in pods.items()
                 if matches({"matchLabels": service["spec"]["selector"]},
                            workload["spec"]["template"]["metadata"]["labels"])
                 and "metrics" in {p.get("name") for c in
                                   workload["spec"]["template"]["spec"]["containers"]
                                   for p in c.get("ports", [])}}
    assert endpoints == set(SERVING)


def test_only_prometheus_reaches_the_metrics_port(render: Renderer) -> None:
    objects = render()
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pods = chart_pods(objects)
    for name in SERVING:
        assert allowed(policies, PROMETHEUS, pods[name], 9470), name
        assert not allowed(policies, PROMETHEUS, pods[name], 4222), name
        assert not allowed(policies, STRANGER, pods[name], 9470), name
    for name in ("nats", "clickhouse"):
        assert not allowed(policies, PROMETHEUS, pods[name], 9470), name
