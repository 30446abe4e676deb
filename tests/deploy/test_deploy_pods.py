"""Every Pod the chart can render is locked down, probed and sized.

The test walks every pod template of every kind (Deployment, StatefulSet,
DaemonSet, Job, CronJob, bare Pod) under every values scenario, so a new
template that forgets the restrictive securityContext, a probe or its
resources fails here without anyone adding a case. The one exception is the
bench agent, and only the part of it documented in values.yaml: its device
access (benchAgent.privileged: privileged with /dev/kfd and /dev/dri from
the host, or root without capabilities when it claims GPUs through the
device plugin) and its workers' output (benchAgent.podLogs: the kubelet's
log directory read-only, and one node directory for its read positions).
No pod ever shares the host's PID or IPC namespace.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import CHART, Renderer
from scenarios import SCENARIOS

AGENT = "bench-agent"
AGENT_HOST_PATHS = {"/dev/kfd", "/dev/dri"}
POD_LOGS, POSITIONS = "/var/log/pods", "/var/lib/primus-safe/pod-logs"


def agent_log_paths(values: dict[str, Any]) -> set[str]:
    """The host paths benchAgent.podLogs adds: the kubelet's log directory
    and, unless kept in the pod, the directory of the read positions."""
    logs = values.get("benchAgent", {}).get("podLogs", {})
    if not logs.get("enabled", True):
        return set()
    return {logs.get("path", POD_LOGS)} | ({p} if (p := logs.get("positionsHostPath",
                                                                  POSITIONS)) else set())


def pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod spec(s) inside any workload kind, found by shape, not by a list
    of the chart's templates."""
    spec = obj.get("spec") or {}
    if obj["kind"] == "Pod":
        yield spec
    if "template" in spec:
        yield spec["template"]["spec"]
    if "jobTemplate" in spec:
        yield spec["jobTemplate"]["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def effective(spec: dict[str, Any], container: dict[str, Any], field: str) -> Any:
    """A security setting as the kubelet applies it: the container's, else the pod's."""
    own = container.get("securityContext", {})
    return own[field] if field in own else spec.get("securityContext", {}).get(field)


def problems(spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """What is missing from the restrictive baseline (empty: none)."""
    sc = container.get("securityContext", {})
    found = []
    if effective(spec, container, "runAsNonRoot") is not True:
        found.append("runAsNonRoot")
    if sc.get("readOnlyRootFilesystem") is not True:
        found.append("readOnlyRootFilesystem")
    if sc.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation")
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
        found.append("capabilities drop ALL, add none")
    if sc.get("privileged"):
        found.append("privileged")
    if (effective(spec, container, "seccompProfile") or {}).get("type") != "RuntimeDefault":
        found.append("seccompProfile RuntimeDefault")
    return found


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component", "")


def workloads_with_pods(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict]]:
    return [(obj, spec) for obj in objects for spec in pod_specs(obj)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_is_restrictive_except_the_agents_device_access(
    render: Renderer, scenario: str
) -> None:
    values = SCENARIOS[scenario]
    pods = workloads_with_pods(render(values))
    assert {component(o) for o, _ in pods} >= {"scheduler", "lens-collector", AGENT}
    for obj, spec in pods:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        assert not spec.get("hostPID") and not spec.get("hostIPC"), name
        host_paths = {v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
        if component(obj) != AGENT:
            assert not spec.get("hostNetwork"), name
            assert not host_paths, name
            for container in containers(spec):
                assert problems(spec, container) == [], f"{name}/{container['name']}"
            continue
        # The agent: exactly the documented exception, nothing more.
        privileged = values.get("benchAgent", {}).get("privileged", True)
        (container,) = spec["containers"]
        sc = container["securityContext"]
        logs = agent_log_paths(values)
        # The kubelet's files are only read (the positions directory is the
        # one written): read-only mounted, whatever the agent's privileges.
        read_only = {v["name"] for v in spec["volumes"]
                     if v.get("hostPath", {}).get("path") in logs - {POSITIONS}}
        assert all(m.get("readOnly") is True for m in container["volumeMounts"]
                   if m["name"] in read_only), name
        if privileged:
            assert sc["privileged"] is True and host_paths == AGENT_HOST_PATHS | logs, name
        else:
            assert host_paths == logs, name
            assert problems(spec, container) == ["runAsNonRoot"], name
            assert sc["runAsUser"] == 0  # opens the root-owned device nodes
        assert spec.get("hostNetwork", False) == values.get("benchAgent", {}).get(
            "hostNetwork", False
        ), name
        assert spec["automountServiceAccountToken"] is False, name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_container_is_probed_and_sized(render: Renderer, scenario: str) -> None:
    for obj, spec in workloads_with_pods(render(SCENARIOS[scenario])):
        for container in spec["containers"]:
            name = f"{obj['kind']}/{obj['metadata']['name']}/{container['name']}"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container.get(probe), f"{name}: no {probe}"
            resources = container.get("resources", {})
            assert resources.get("requests", {}).get("cpu"), f"{name}: no cpu request"
            assert resources.get("requests", {}).get("memory"), f"{name}: no memory request"
            assert resources.get("limits", {}).get("memory"), f"{name}: no memory limit"
        for container in spec.get("initContainers", []):
            assert container.get("resources", {}).get("limits", {}).get("memory"), obj


def test_the_walk_catches_a_forgetful_template(render: Renderer, tmp_path: Path) -> None:
    """A new template without the baseline is caught (the walk is not vacuous)."""
    chart = tmp_path / "primus-safe"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "forgetful.yaml").write_text(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: forgetful\n"
        "  labels: {app.kubernetes.io/component: forgetful}\n"
        "spec:\n  schedule: '@daily'\n  jobTemplate:\n    spec:\n      template:\n"
        "        spec:\n          restartPolicy: Never\n"
        "          containers: [{name: c, image: busybox}]\n"
    )
    objects = render(chart=chart)
    (spec,) = [s for o, s in workloads_with_pods(objects) if o["metadata"]["name"] == "forgetful"]
    assert problems(spec, spec["containers"][0]) == [
        "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation",
        "capabilities drop ALL, add none", "seccompProfile RuntimeDefault"]


def test_the_agents_needs_are_documented() -> None:
    """The reasons sit next to the switches (values.yaml) and in the README."""
    values = (CHART / "values.yaml").read_text()
    for reason in ("Why privileged", "/dev/kfd", "/dev/dri", "video", "render", "hostPID",
                   "/var/log/pods", "read-only", "positionsHostPath"):
        assert reason in values, reason
    readme = (CHART.parents[2] / "README.md").read_text()
    assert "/dev/kfd" in readme and "hostPID" in readme
