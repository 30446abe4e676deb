"""Constants and helpers shared by the deployment tests (no fixtures here)."""

from __future__ import annotations

import argparse
import os
import re
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
SECRET_ENV = frozenset({"PRIMUS_NATS_TOKEN", "PRIMUS_NATS_PASSWORD", "PRIMUS_CLICKHOUSE_DSN"})


def secret_env(verb: str, *, nats_auth: str = "users") -> frozenset[str]:
    """The secrets a service gets: its NATS password (or the shared token);
    the ClickHouse DSN only for lens-collector, the one service that writes."""
    nats = "PRIMUS_NATS_PASSWORD" if nats_auth == "users" else "PRIMUS_NATS_TOKEN"
    return frozenset({nats} | ({"PRIMUS_CLICKHOUSE_DSN"} if verb == "lens-collector" else set()))

# CLI verb of each service run as a Deployment.
DEPLOYMENT_VERBS = ("bootstrap", "scheduler", "lens-collector", "failover", "bench-coordinator")
ALL_VERBS = (*DEPLOYMENT_VERBS, "bench-agent")


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """argv of a `primus-safe ...` command line (without the program name),
    parsed by the real CLI parser; an assertion names the command it refuses.
    A health check must name a service the CLI runs."""
    from cli.main import SERVICE_VERBS, build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        raise AssertionError(f"primus-safe {' '.join(argv)}: refused by the CLI") from exit_
    if args.verb == "health":
        assert args.service in SERVICE_VERBS, f"primus-safe {' '.join(argv)}: no such service"
    return args


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


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(workload)["containers"]
    return container


def mounted_file(workload: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volume behind a file path in the main container, and the file's key in it."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    for mount in main_container(workload)["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            return volumes[mount["name"]], path[len(prefix) :]
    raise AssertionError(f"{path} is not mounted")


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with no VAR set: the default; ``$$`` is a ``$``."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value).replace("$$", "$")
