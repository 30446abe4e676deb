"""A small Kubespray-shaped checkout for tests: cluster.yml, scale.yml,
facts.yml and remove-node.yml with Kubespray's host patterns, run by the
real ansible-runner against localhost (``connection: local``), each
recording per host the variables it got, so tests see exactly what
``bootstrap apply`` asked Kubespray to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def make_kubespray(root: Path, record: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    record.mkdir(parents=True, exist_ok=True)
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
