"""Every image the chart, the compose file and the Dockerfile name is an exact
version, so that an install or a rebuild next month runs what was tested.

The rule (``floating``) is a pure function with its own table of good and bad
references; the collectors gather every image reference: the containers of
every rendered scenario (and the training image the scheduler hands its
workers), compose services that are pulled (not built here), the Dockerfile's
FROM lines with their ARG defaults and every ARG default naming an image.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from deploy_helpers import REPO, Renderer, pod_spec, workloads
from scenarios import SCENARIOS

FLOATING_TAGS = frozenset({"latest", "main", "master", "stable", "edge", "nightly", "dev",
                           "lts", "current", "rolling"})
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# A version: numbers joined by dots; exact when it has at least three of them.
VERSION = re.compile(r"\d+(?:\.\d+)*")


def split(ref: str) -> tuple[str, str | None, str | None]:
    """(repository, tag, digest) of an image reference."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :], digest or None
    return name, None, digest or None


def floating(ref: str) -> str | None:
    """Why an image reference may change under the same name; None when it is
    pinned: a sha256 digest, or a tag whose first version number has at least
    three parts (2.11.16-alpine, 25.3.14.14, rocm7.2.4_..., 3.11.14-slim).
    No tag, latest/main/master/stable/edge, or a major or major.minor only
    (2.11-alpine, 25.3, 3.11-slim) float. Pure."""
    repository, tag, digest = split(ref)
    if not repository or "${" in ref or "{{" in ref:
        return f"{ref!r}: not a resolved image reference"
    if digest is not None:
        return None if DIGEST.fullmatch(digest) else f"{ref!r}: malformed digest"
    if not tag:
        return f"{ref!r}: no tag (means latest)"
    if tag.lower() in FLOATING_TAGS:
        return f"{ref!r}: {tag!r} is a moving tag"
    version = VERSION.search(tag)
    if version is None:
        return f"{ref!r}: tag {tag!r} names no version"
    if version.group().count(".") < 2:
        return f"{ref!r}: {version.group()} is a major/minor only; name the exact patch"
    return None


@pytest.mark.parametrize("ref", [
    "nats:2.11.16-alpine",
    "clickhouse/clickhouse-server:25.3.14.14",
    "rocm/pytorch:rocm7.2.4_ubuntu24.04_py3.12_pytorch_release_2.10.0",
    "python:3.11.14-slim-bookworm",
    "grafana/grafana:12.1.1",
    "registry.example.org:5000/team/primus-safe:0.1.0",
    "primus-safe-agent-rocm:v1.2.3",
    "nats@sha256:" + "a" * 64,
    "nats:2.11-alpine@sha256:" + "0123456789abcdef" * 4,
])
def test_pinned_references(ref: str) -> None:
    assert floating(ref) is None


@pytest.mark.parametrize(("ref", "why"), [
    ("nats", "no tag"),
    ("registry.example.org:5000/nats", "no tag"),
    ("rocm/pytorch:latest", "moving tag"),
    ("nats:main", "moving tag"),
    ("nats:master", "moving tag"),
    ("grafana/grafana:stable", "moving tag"),
    ("alpine:edge", "moving tag"),
    ("nats:2.11-alpine", "major/minor only"),
    ("clickhouse/clickhouse-server:25.3", "major/minor only"),
    ("python:3.11-slim-bookworm", "major/minor only"),
    ("nats:2", "major/minor only"),
    ("rocm/pytorch:rocm6.4_ubuntu24.04_py3.12_pytorch_release_2.6.0", "major/minor only"),
    ("busybox:musl", "names no version"),
    ("nats@sha256:abc", "malformed digest"),
    ("python:${PYTHON_VERSION}-slim", "not a resolved"),
])
def test_floating_references(ref: str, why: str) -> None:
    reason = floating(ref)
    assert reason is not None and why in reason, reason


# ------------------------------------------------------------- collectors ---


def chart_images(objects: list[dict[str, Any]]) -> set[str]:
    """Every container image of every pod template, and the workers' image."""
    images = set()
    for obj in objects:
        spec = obj.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if not template:
            continue
        pod = template["spec"]
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            images.add(container["image"])
    scheduler = workloads(objects).get("scheduler")
    if scheduler:
        (container,) = pod_spec(scheduler)["containers"]
        for env in container["env"]:
            if env["name"] == "PRIMUS_K8S_IMAGE":
                images.add(env["value"])
    return images


def compose_images() -> set[str]:
    """Images compose pulls; one it builds from this tree (`build:`) is ours."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return {s["image"] for s in compose["services"].values() if "build" not in s}


def dockerfile_images() -> set[str]:
    """FROM lines (ARG defaults substituted, earlier stages skipped) and every
    ARG default that names an image (*_IMAGE)."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.MULTILINE))
    stages: set[str] = set()
    images = {v for k, v in args.items() if k.endswith("_IMAGE")}
    for base, stage in re.findall(r"^FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", text,
                                  flags=re.MULTILINE | re.IGNORECASE):
        resolved = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                          lambda m: args.get(m.group(1) or m.group(2), m.group(0)), base)
        if resolved not in stages:
            images.add(resolved)
        if stage:
            stages.add(stage)
    return images


@pytest.fixture(scope="module")
def rendered_images(render: Renderer) -> dict[str, set[str]]:
    return {name: chart_images(render(values)) for name, values in SCENARIOS.items()}


def test_the_chart_names_only_pinned_images(rendered_images: dict[str, set[str]]) -> None:
    every = set().union(*rendered_images.values())
    assert {split(ref)[0] for ref in every} >= {
        "primus-safe", "primus-safe-agent-rocm", "nats", "clickhouse/clickhouse-server"}
    bad = {f"{name}: {floating(ref)}" for name, images in rendered_images.items()
           for ref in images if floating(ref)}
    assert not bad, sorted(bad)


def test_every_chart_image_is_overridable(render: Renderer) -> None:
    """repository and tag of each image come from values (a digest rides on the tag)."""
    digest = "sha256:" + "b" * 64
    values = {
        "image": {"repository": "reg.example/primus-safe", "tag": "9.9.9"},
        "benchAgent": {"image": {"repository": "reg.example/agent", "tag": f"9.9.9@{digest}"}},
        "nats": {"image": {"repository": "reg.example/nats", "tag": "2.11.99-alpine"}},
        "clickhouse": {"image": {"repository": "reg.example/clickhouse", "tag": "25.3.9.9"}},
    }
    images = chart_images(render(values))
    assert images == {"reg.example/primus-safe:9.9.9", f"reg.example/agent:9.9.9@{digest}",
                      "reg.example/nats:2.11.99-alpine", "reg.example/clickhouse:25.3.9.9"}


def test_compose_pulls_only_pinned_images() -> None:
    images = compose_images()
    assert {split(ref)[0] for ref in images} == {
        "nats", "clickhouse/clickhouse-server", "grafana/grafana"}
    bad = [floating(ref) for ref in images if floating(ref)]
    assert not bad, bad


def test_the_dockerfile_builds_only_on_pinned_images() -> None:
    images = dockerfile_images()
    assert {split(ref)[0] for ref in images} == {"python", "rocm/pytorch"}
    bad = [floating(ref) for ref in images if floating(ref)]
    assert not bad, bad


def test_chart_and_compose_run_the_same_servers() -> None:
    """The bundled NATS and ClickHouse are the versions compose tests with."""
    values = yaml.safe_load((REPO / "deploy/helm/primus-safe/values.yaml").read_text())
    chart = {f"{values[k]['image']['repository']}:{values[k]['image']['tag']}"
             for k in ("nats", "clickhouse")}
    assert chart <= compose_images()
