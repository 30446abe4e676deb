"""A small Kubespray-shaped checkout for tests: cluster.yml, scale.yml,
facts.yml and remove-node.yml with Kubespray's host patterns, run by the
real ansible-runner against localhost (``connection: local``), each
recording per host the variables it got, so tests see exactly what
``bootstrap apply`` asked Kubespray to do.

It says which release it is the way a real checkout does (``galaxy.yml``,
``requirements.txt``, ``playbooks/ansible_version.yml``), and comes with an
Ansible environment for ``--ansible-venv``: its ``ansible-playbook`` and
``ansible`` note each call (the program, its arguments and PATH) and then
run the platform's own, which the fake release's version bounds accept."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

RELEASE = "2.31.0"
_WRAPPER = """\
#!/bin/sh
printf '%s\\t%s\\t%s\\n' "$0" "$PATH" "$*" >> "{log}"
exec "{real}" "$@"
"""

# Each play writes {playbook}-{host}.json into the record folder.
_PLAY = """\
- hosts: "{hosts}"
  gather_facts: false
  connection: local
  tasks:
    - name: {name}
      ansible.builtin.copy:
        dest: "{record}/{playbook}-{{{{ inventory_hostname }}}}.json"
        content: "{{{{ {content} | to_json }}}}"
"""

_COMMON = ("'limit': ansible_limit | default(''), 'inventory': groups['all'], "
           "'kube_version': kube_version | default('')")
_PLAYBOOKS = {
    "cluster": ("all", "install kubernetes", _COMMON),
    "facts": ("all", "gather facts", _COMMON),
    "scale": ("kube_node", "join workers", _COMMON),
    # Kubespray: "{{ node | default('etcd:k8s_cluster:calico_rr') }}" and its vars
    "remove-node": ("{{ node | default('kube_node') }}", "remove node", _COMMON
                    + ", 'node': node | default(''), 'reset_nodes': reset_nodes | default(true),"
                    " 'allow_ungraceful_removal': allow_ungraceful_removal | default(false),"
                    " 'skip_confirmation': skip_confirmation | default(false)"),
}


def release_files(root: Path, release: str = RELEASE) -> Path:
    """What tells a checkout's release and the Ansible it needs."""
    core = version("ansible-core")
    major, minor = (int(p) for p in core.split(".")[:2])
    (root / "playbooks").mkdir(parents=True, exist_ok=True)
    (root / "galaxy.yml").write_text(f"namespace: kubernetes_sigs\nname: kubespray\n"
                                     f"version: {release}\n")
    (root / "requirements.txt").write_text(f"ansible-core=={core}\n")
    (root / "playbooks" / "ansible_version.yml").write_text(
        f"- hosts: all\n  vars:\n    minimal_ansible_version: {major}.{minor}.0\n"
        f"    maximal_ansible_version: {major}.{minor + 1}.0\n")
    return root


def ansible_env(root: Path) -> Path:
    """The --ansible-venv for checkout ``root`` (built once, beside it)."""
    env = root.parent / f"{root.name}-ansible"
    (env / "bin").mkdir(parents=True, exist_ok=True)
    real = Path(sys.executable).parent
    for tool in ("ansible-playbook", "ansible"):
        path = env / "bin" / tool
        path.write_text(_WRAPPER.format(log=env / "calls.log", real=real / tool))
        path.chmod(0o755)
    return env


def kubespray_args(root: Path) -> list[str]:
    return ["--kubespray", str(root), "--ansible-venv", str(ansible_env(root))]


def calls(root: Path) -> list[tuple[str, str, str]]:
    """(program, PATH, arguments) of each Ansible call through the env."""
    log = root.parent / f"{root.name}-ansible" / "calls.log"
    if not log.exists():
        return []
    return [tuple(line.split("\t", 2)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def make_kubespray(root: Path, record: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    record.mkdir(parents=True, exist_ok=True)
    release_files(root)
    ansible_env(root)
    for playbook, (hosts, name, content) in _PLAYBOOKS.items():
        (root / f"{playbook}.yml").write_text(_PLAY.format(
            hosts=hosts, name=name, record=record, playbook=playbook,
            content="{" + content + "}"))
    return root


def recorded(record: Path, playbook: str) -> dict[str, dict[str, Any]]:
    """host -> the variables ``playbook`` saw there."""
    out = {}
    for path in sorted(record.glob(f"{playbook}-*.json")):
        out[path.stem.removeprefix(f"{playbook}-")] = json.loads(path.read_text())
    return out


def clear(record: Path) -> None:
    for path in record.glob("*.json"):
        path.unlink()
