"""The Dockerfile, read statically (building it needs a Docker daemon).

Pins the contract the chart and the compose file rely on: the default target
is the service image, every runnable stage starts `primus-safe` as a fixed
unprivileged user, and the agent stage adds the `agent` extra.
"""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from deploy_helpers import REPO

DOCKERFILE = REPO / "Dockerfile"


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions per stage name, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", rest.strip(), flags=re.IGNORECASE)
            assert match, f"every stage is named: FROM {rest}"
            current = result.setdefault(match.group(2), [])
            current.append(("FROM", match.group(1)))
        elif result:
            current.append((instruction, rest.strip()))
    return result


def last(stage: list[tuple[str, str]], instruction: str) -> str | None:
    values = [rest for name, rest in stage if name == instruction]
    return values[-1] if values else None


def test_default_target_is_the_service_image() -> None:
    assert list(stages())[-1] == "runtime"


@pytest.mark.parametrize("stage", ["runtime", "agent", "agent-rocm"])
def test_runnable_stages_start_primus_safe_as_a_fixed_user(stage: str) -> None:
    instructions = stages()[stage]
    assert json.loads(last(instructions, "ENTRYPOINT")) == ["primus-safe"]
    user = last(instructions, "USER")
    assert user is not None and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", user), user


def test_image_user_matches_the_chart() -> None:
    # The chart's podSecurityContext runs as 10001; so does the image.
    values = (REPO / "deploy/helm/primus-safe/values.yaml").read_text()
    assert "runAsUser: 10001" in values
    assert last(stages()["runtime"], "USER") == "10001:10001"


def test_agent_stage_installs_the_agent_extra() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "agent" in pyproject["project"]["optional-dependencies"]
    runs = " ".join(rest for name, rest in stages()["agent-build"] if name == "RUN")
    assert '".[agent]"' in runs
    assert last(stages()["agent"], "CMD") == '["bench-agent"]'


@pytest.mark.parametrize("stage", ["build", "agent-rocm"])
def test_build_context_holds_what_the_image_copies(stage: str) -> None:
    for instruction, rest in stages()[stage]:
        if instruction == "COPY" and not rest.startswith("--from"):
            *sources, _destination = rest.split()
            for source in sources:
                if any(c in source for c in "*?["):
                    continue  # a glob: optional by design
                assert (REPO / source).exists(), f"COPY {source}: missing from the repository"


def test_rocm_build_is_documented() -> None:
    text = DOCKERFILE.read_text()
    assert "rocm/pytorch" in text
    for note in ("/dev/kfd", "/dev/dri", "video", "render", "WITHOUT the `agent` extra"):
        assert note in text, note


def test_rocm_agent_stage_keeps_the_bases_rocm_torch() -> None:
    """agent-rocm builds FROM the ROCM_PYTORCH_IMAGE build arg (a rocm/pytorch
    image), refuses a base whose torch is not a ROCm build, and installs the
    project without the `agent` extra, whose torch pin would replace it."""
    args = dict(
        m.groups()
        for m in re.finditer(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    )
    assert args["ROCM_PYTORCH_IMAGE"].startswith("rocm/pytorch:")
    rocm = stages()["agent-rocm"]
    assert rocm[0] == ("FROM", "${ROCM_PYTORCH_IMAGE}")
    runs = " ".join(rest for name, rest in rocm if name == "RUN")
    assert "torch.version.hip" in runs
    assert "pip install /src" in runs and "[agent]" not in runs
    assert last(rocm, "CMD") == '["bench-agent"]'
    # The chart's agent image is this stage's documented tag.
    values = (REPO / "deploy/helm/primus-safe/values.yaml").read_text()
    assert "repository: primus-safe-agent-rocm" in values
    assert "--target agent-rocm -t primus-safe-agent-rocm" in DOCKERFILE.read_text()
