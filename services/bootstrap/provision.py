"""The imperative side of ``bootstrap plan|apply``: read what was applied
last, write the rendered files, and run Kubespray through ansible-runner.

Validation and planning happen before anything here writes a byte (bad input
never half-applies). The last applied hosts file is kept next to the rendered
inventory so a re-apply touches only what changed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from libs import yaml_files
from libs.gc_pause import paused_gc
from libs.inventory import HostsFile, HostSpec
from libs.kubespray import KubesprayRelease
from services.bootstrap.ansible_env import AnsibleEnv
from services.bootstrap.plan import Plan, make_plan
from services.bootstrap.render import kubespray_refusals, render

APPLIED = "applied-hosts.yaml"


@dataclass(frozen=True)
class Workspace:
    """Where one cluster's rendered files and last applied hosts file live."""

    root: Path
    cluster: str

    @property
    def inventory(self) -> Path:
        return self.root / "inventory" / self.cluster

    @property
    def applied(self) -> Path:
        return self.inventory / APPLIED

    def last_applied(self) -> HostsFile | None:
        try:
            # The same fast, bounded reader as the operator's own file: at
            # 10,000 nodes the pure-Python loader alone took 13 s of a re-plan.
            return HostsFile.model_validate(yaml_files.load(self.applied).data)
        except (OSError, ValidationError, yaml_files.YamlFileError):
            return None  # nothing applied yet (or unreadable): plan everything

    def rendered_files(self) -> dict[str, str]:
        if not self.inventory.is_dir():
            return {}
        return {str(p.relative_to(self.root)): p.read_text()
                for p in sorted(self.inventory.rglob("*"))
                if p.suffix in (".yaml", ".yml") and p.name != APPLIED}


def plan_for(hosts: HostsFile, root: Path, *, live: dict[str, HostSpec] | None = None,
             release: KubesprayRelease | None = None) -> tuple[Plan, dict[str, str]]:
    """The plan against what ``root`` holds (nodes against ``live`` when
    given), and the files it would write for Kubespray ``release``."""
    ws = Workspace(root, hosts.cluster)
    files = render(hosts, release)
    if hosts.provisioned and (refused := kubespray_refusals(files, hosts.cluster, release)):
        # A valid hosts file never gets here: the renderer broke a rule.
        raise ValueError("the rendered inventory breaks Kubespray's own checks: "
                         + "; ".join(refused))
    return make_plan(ws.last_applied(), hosts, old_files=ws.rendered_files(),
                     new_files=files, live=live), files


def write_removal_inventory(hosts: HostsFile, leaving: list[HostSpec], where: Path,
                            release: KubesprayRelease | None = None) -> Path:
    """An inventory of ``hosts`` plus the nodes leaving, in ``where``:
    Kubespray's remove-node.yml must find the node in the inventory it runs
    with. Not validated again: the leaving nodes may break checks (an even
    etcd count) that only the new file has to pass."""
    with_leaving = HostsFile.model_construct(
        **{**dict(hosts), "nodes": [*hosts.nodes, *leaving]})
    for rel, text in render(with_leaving, release).items():
        (where / rel).parent.mkdir(parents=True, exist_ok=True)
        (where / rel).write_text(text)
    return where / "inventory" / hosts.cluster / "hosts.yaml"


def write_files(root: Path, plan: Plan, files: dict[str, str]) -> None:
    """Write only the rendered files the plan changes."""
    for change in plan.files:
        path = root / change.path
        if change.action == "delete":
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(files[change.path])
        tmp.replace(path)  # atomic: a crash never leaves half a file


def record_applied(hosts: HostsFile, root: Path) -> None:
    """Remember ``hosts`` as applied; only after provisioning succeeded, so a
    failed run is planned (and retried) again."""
    ws = Workspace(root, hosts.cluster)
    ws.inventory.mkdir(parents=True, exist_ok=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter when present
    with paused_gc():
        text = yaml.dump(hosts.model_dump(mode="json"), Dumper=dumper, sort_keys=False)
    ws.applied.write_text(text)


@dataclass(frozen=True)
class Progress:
    """One line of playbook progress, from an ansible-runner event."""

    event: str
    host: str
    task: str

    def __str__(self) -> str:
        status = self.event.removeprefix("runner_on_").removeprefix("playbook_on_")
        return f"{status:<10} {self.host or '-':<16} {self.task}"


@dataclass(frozen=True)
class ProvisionResult:
    rc: int
    status: str
    failed_hosts: tuple[str, ...]
    ok_hosts: tuple[str, ...]
    command: tuple[str, ...] = ()  # what ansible-runner ran
    path: str = ""  # the PATH it ran with


_SHOWN = {"runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped",
          "playbook_on_task_start"}


def probe_unreachable(*, env: AnsibleEnv, inventory: Path, nodes: list[str],
                      extravars: dict[str, Any] | None = None) -> list[str]:
    """The nodes Ansible cannot reach (an ad-hoc ``ping`` through
    ansible-runner): remove-node.yml must not try to reset those."""
    import ansible_runner

    if not nodes:
        return []
    private = Path(tempfile.mkdtemp(prefix="primus-ansible-"))
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private), host_pattern=",".join(nodes), module="ping",
            inventory=str(inventory.resolve()), extravars=extravars or {}, quiet=True,
            envvars=env.envvars())
        stats = runner.stats or {}
        return sorted(set(stats.get("dark", {})) & set(nodes))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def run_playbook(*, env: AnsibleEnv, project_dir: Path, playbook: str, inventory: Path,
                 on_progress: Callable[[Progress], None],
                 extravars: dict[str, Any] | None = None,
                 limit: str | None = None) -> ProvisionResult:
    """Run ``playbook`` (relative to ``project_dir``, e.g. Kubespray's
    cluster.yml) against ``inventory`` through ansible-runner with ``env``'s
    ansible-playbook (Kubespray's Ansible, never the platform's), streaming
    progress; the private data dir is temporary so runs never share state."""
    import ansible_runner  # heavy; only ``apply`` needs it

    def handler(event: dict[str, Any]) -> bool:
        if event.get("event") in _SHOWN:
            data = event.get("event_data", {})
            on_progress(Progress(event["event"], data.get("host", ""), data.get("task", "")))
        return True

    private = Path(tempfile.mkdtemp(prefix="primus-ansible-"))
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private), project_dir=str(project_dir),
            playbook=playbook, inventory=str(inventory.resolve()),
            extravars=extravars or {}, quiet=True, event_handler=handler, limit=limit,
            envvars=env.envvars(),  # its bin first: pexpect finds its ansible-playbook
        )
        stats = runner.stats or {}
        failed = set(stats.get("failures", {})) | set(stats.get("dark", {}))
        ok = set(stats.get("ok", {})) - failed
        return ProvisionResult(runner.rc, runner.status, tuple(sorted(failed)), tuple(sorted(ok)),
                               command=tuple(runner.config.command),
                               path=runner.config.env.get("PATH", ""))
    finally:
        shutil.rmtree(private, ignore_errors=True)
