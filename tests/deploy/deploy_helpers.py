"""Constants and helpers shared by the deployment tests (no fixtures here)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "primus-safe"
HELM = REPO / ".tools" / "helm"
RELEASE = "primus"
NAMESPACE = "primus-system"

# Kubernetes versions every rendered object must validate against.
KUBE_VERSIONS = ("1.30.0", "1.33.0")

# The settings contract with the code: the only variables the chart and the
# compose file may pass to a Primus-SaFE container are the settings model's.
PRIMUS_ENV = frozenset(f"PRIMUS_{name.upper()}" for name in Settings.model_fields)
SECRET_ENV = frozenset({"PRIMUS_NATS_TOKEN", "PRIMUS_CLICKHOUSE_DSN"})

# CLI verb of each service run as a Deployment.
DEPLOYMENT_VERBS = ("bootstrap", "scheduler", "lens-collector", "failover", "bench-coordinator")
ALL_VERBS = (*DEPLOYMENT_VERBS, "bench-agent")


def helm_runs(binary: Path) -> bool:
    """Whether binary exists and answers `version`."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    probe = subprocess.run([binary, "version", "--short"], capture_output=True, timeout=60)
    return probe.returncode == 0


Renderer = Callable[..., list[dict[str, Any]]]


def run_helm(helm: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *map(str, args)], capture_output=True, text=True, timeout=120)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Primus-SaFE workloads (Deployments and the agent DaemonSet) by component."""
    return {
        component(o): o
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet") and component(o) in ALL_VERBS
    }
