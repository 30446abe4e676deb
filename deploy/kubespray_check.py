"""Hold the renderer's Kubespray rules against a real Kubespray checkout.

    python deploy/kubespray_check.py ~/kubespray [HOSTS.yaml]

Renders HOSTS.yaml (default: 3 control-plane/etcd nodes and 4 GPU workers)
for the checkout's release, then runs Kubespray's own first checks on it —
``playbooks/ansible_version.yml`` and the ``kubespray_defaults`` +
``validate_inventory`` roles, as ``cluster.yml`` starts — with the
checkout's own Ansible (built once from its requirements.txt, as ``bootstrap
apply`` does; needs PyPI the first time). It does the same for variants of
that inventory that break one rule each, and says for every case whether
Kubespray and ``libs.kubespray.inventory_problems`` agree; ours may be
stricter (v2.30 finds a Kubernetes version without checksums only later, in
its download role), never laxer. Nothing connects
to a machine (``connection: local``; no task there touches the host).
Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs.inventory import HostsFile  # noqa: E402
from libs.kubespray import inventory_problems  # noqa: E402
from services.bootstrap.ansible_env import env_for  # noqa: E402
from services.bootstrap.kubespray_checkout import read_release  # noqa: E402
from services.bootstrap.render import render  # noqa: E402

LAB = {"cluster": "lab", "provision": True, "kubernetes": {"network_plugin": "cilium"},
       "nodes": [{"name": f"cp-{i}", "ip": f"10.0.0.{i}", "roles": ["control-plane", "etcd"],
                  "gpu_model": "cpu", "gpu_count": 0} for i in (1, 2, 3)]
       + [{"name": f"gpu-{i}", "ip": f"10.0.0.{10 + i}", "gpu_model": "MI300X", "gpu_count": 8}
          for i in (1, 2, 3, 4)]}

PLAYBOOK = """\
- name: Kubespray's Ansible version check
  import_playbook: {checkout}/playbooks/ansible_version.yml
- name: Kubespray's inventory validation, as cluster.yml runs it first
  hosts: all
  gather_facts: false
  connection: local
  roles:
    - role: kubespray_defaults
    - role: validate_inventory
"""

Change = Callable[[dict[str, Any], dict[str, Any]], None]


def _many_nodes(inv: dict[str, Any], _: dict[str, Any]) -> None:
    for i in range(70):
        inv["all"]["hosts"][f"w-{i}"] = {"ansible_host": f"10.1.0.{i + 1}"}
        inv["all"]["children"]["kube_node"]["hosts"][f"w-{i}"] = None


def _even_etcd(inv: dict[str, Any], _: dict[str, Any]) -> None:
    first_worker = next(iter(inv["all"]["children"]["kube_node"]["hosts"]))
    inv["all"]["children"]["etcd"]["hosts"][first_worker] = None


def _set(**values: Any) -> Change:
    return lambda _, var: var.update(values)


CASES: dict[str, Change] = {
    "as rendered": lambda _inv, _var: None,
    "kube_version with a v": lambda _, var: var.update(kube_version=f"v{var['kube_version']}"),
    "kube_version too old": _set(kube_version="1.20.0"),
    "kube_version without checksums": _set(kube_version="1.99.0"),
    "70 more nodes, /18 pods, cilium": _many_nodes,
    "even etcd": _even_etcd,
    "removed variable": _set(kubelet_static_pod_path="/etc/kubernetes/manifests"),
    "boolean as a string": _set(helm_enabled="true"),
    "unknown network plugin": _set(kube_network_plugin="weave"),
    "/26 per node for 110 pods": _set(kube_network_node_prefix=26),
}
_TASK = re.compile(r"TASK \[(?:[a-z_]+ : )?([^\]]+)\][^\n]*\n(.*?)(?=\nTASK \[|\nPLAY RECAP)", re.S)


def kubespray_failures(checkout: Path, bin_dir: Path, inventory: dict[str, Any],
                       variables: dict[str, Any]) -> tuple[int, list[str]]:
    """Kubespray's verdict on one inventory: its exit code and failed tasks."""
    with tempfile.TemporaryDirectory(prefix="kubespray-check-") as tmp:
        where = Path(tmp)
        (where / "group_vars" / "k8s_cluster").mkdir(parents=True)
        (where / "hosts.yaml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        (where / "group_vars/k8s_cluster/k8s-cluster.yml").write_text(yaml.safe_dump(variables))
        (where / "check.yml").write_text(PLAYBOOK.format(checkout=checkout.resolve()))
        env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
               "HOME": os.environ.get("HOME", tmp), "ANSIBLE_CONFIG": str(checkout / "ansible.cfg"),
               "ANSIBLE_ROLES_PATH": str(checkout / "roles")}
        out = subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(where / "hosts.yaml"),
                              str(where / "check.yml")], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=600)
    failed = sorted({name for name, body in _TASK.findall(out.stdout) if "fatal:" in body})
    return out.returncode, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kubespray", type=Path)
    parser.add_argument("hosts", type=Path, nargs="?")
    args = parser.parse_args()
    release = read_release(args.kubespray)
    doc = yaml.safe_load(args.hosts.read_text()) if args.hosts else LAB
    hosts = HostsFile.model_validate(doc, context={"kubespray": release})
    env = env_for(args.kubespray, on_line=lambda line: print(f"  {line[:110]}", flush=True))
    env.check(release)
    files = render(hosts, release)
    base = f"inventory/{hosts.cluster}"
    inventory = yaml.safe_load(files[f"{base}/hosts.yaml"])
    variables = yaml.safe_load(files[f"{base}/group_vars/k8s_cluster/k8s-cluster.yml"])
    print(f"{release.name}, ansible-core {env.core_version()} from {env.root}")
    rows = []
    for name, change in CASES.items():
        inv, var = copy.deepcopy(inventory), copy.deepcopy(variables)
        change(inv, var)
        rc, failed = kubespray_failures(args.kubespray, env.bin, inv, var)
        ours = inventory_problems(release, inv, var)
        verdict = ("agree" if (rc != 0) == bool(ours) else "stricter" if ours else "MISSED")
        rows.append({"case": name, "kubespray_rc": rc, "kubespray_failed": failed,
                     "ours": ours, "verdict": verdict})
        print(f"{name:34} kubespray {'refuses' if rc else 'accepts':7}  ours "
              f"{'refuses' if ours else 'accepts':7}  {verdict:8}  {'; '.join(failed)[:60]}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("agree", "stricter", "MISSED")}
    accepted = rows[0]["kubespray_rc"] == 0
    print(json.dumps({"name": "kubespray_rules_agreement", "release": release.version,
                      "cases": len(rows), **counts, "rendered_accepted": accepted}))
    return 0 if accepted and not counts["MISSED"] else 1


if __name__ == "__main__":
    sys.exit(main())
