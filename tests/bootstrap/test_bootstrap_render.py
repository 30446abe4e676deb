"""Rendering and planning, checked with the real Ansible tools: the
inventory through ``ansible-inventory --list``, and ``bootstrap apply``
through the real ansible-runner on a small playbook against localhost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from libs.events import JobSpec, WorkerSlot
from libs.inventory import HostsFile, local_hosts
from libs.records import JobRecord
from services.bootstrap.plan import busy_jobs, describe, make_plan
from services.bootstrap.render import render
from tests.bootstrap.kubespray_dir import ansible_env, calls, kubespray_args, release_files
from tests.helpers import ROOT, run_cli

BIN = Path(sys.executable).parent
HOSTS = {
    "cluster": "lab", "provision": True,
    "kubernetes": {"version": "v1.34.3", "network_plugin": "cilium"},
    "nodes": [
        {"name": "cp-1", "ip": "10.0.0.1", "roles": ["control-plane", "etcd"],
         "gpu_model": "cpu", "gpu_count": 0, "ssh_user": "ubuntu", "ssh_key": "/keys/lab"},
        {"name": "gpu-1", "ip": "10.0.0.11", "labels": {"rack": "r1", "switch": "s1"},
         "gpu_model": "MI300X", "gpu_count": 8},
        {"name": "gpu-2", "ip": "10.0.0.12", "labels": {"rack": "r1", "switch": "s1"},
         "gpu_model": "MI300X", "gpu_count": 8},
    ],
}


def hosts(**changes: object) -> HostsFile:
    return HostsFile.model_validate({**HOSTS, **changes})


def test_render_is_stable_and_complete() -> None:
    files = render(hosts())
    assert files == render(hosts())
    assert "inventory/lab/hosts.yaml" in files
    k8s = yaml.safe_load(files["inventory/lab/group_vars/k8s_cluster/k8s-cluster.yml"])
    # Kubespray v2.28 and later write kube_version without the "v".
    assert k8s["kube_network_plugin"] == "cilium" and k8s["kube_version"] == "1.34.3"
    assert k8s["cluster_name"] == "lab" and k8s["dns_domain"] == "cluster.local"
    assert not [p for p in files if "/addons/" in p]  # nothing deploys add-on values


def test_ansible_reads_the_rendered_inventory(tmp_path: Path) -> None:
    for rel, text in render(hosts()).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    out = subprocess.run([str(BIN / "ansible-inventory"), "-i",
                          str(tmp_path / "inventory/lab/hosts.yaml"), "--list"],
                         capture_output=True, text=True, check=True, timeout=120)
    inv = json.loads(out.stdout)
    assert inv["kube_control_plane"]["hosts"] == ["cp-1"]
    assert inv["etcd"]["hosts"] == ["cp-1"]
    assert sorted(inv["kube_node"]["hosts"]) == ["gpu-1", "gpu-2"]
    assert set(inv["k8s_cluster"]["children"]) == {"kube_control_plane", "kube_node"}
    cp = inv["_meta"]["hostvars"]["cp-1"]
    assert cp["ansible_host"] == "10.0.0.1" and cp["ansible_user"] == "ubuntu"
    assert cp["ansible_ssh_private_key_file"] == "/keys/lab"
    gpu = inv["_meta"]["hostvars"]["gpu-1"]
    assert gpu["node_labels"]["primus-safe/rack"] == "r1"
    assert gpu["node_labels"]["primus-safe/gpu-vendor"] == "amd"


def test_reapplying_an_edited_file_plans_only_the_differences() -> None:
    old = hosts()
    nodes = [HOSTS["nodes"][0], {**HOSTS["nodes"][1], "gpu_count": 4},  # type: ignore[index]
             {"name": "gpu-3", "ip": "10.0.0.13", "gpu_model": "MI300X", "gpu_count": 8}]
    new = hosts(nodes=nodes)
    plan = make_plan(old, new, old_files=render(old), new_files=render(new))
    assert [(c.node, c.action, c.fields) for c in plan.nodes] == [
        ("gpu-1", "update", ("gpu_count",)), ("gpu-3", "add", ()), ("gpu-2", "remove", ())]
    assert {f.path for f in plan.files} == {"inventory/lab/hosts.yaml"}
    assert "- node gpu-2 after its jobs are moved away" in describe(plan)
    same = make_plan(new, new, old_files=render(new), new_files=render(new))
    assert same.empty and describe(same).startswith("no changes")


def test_busy_jobs_sees_only_running_jobs_on_the_node() -> None:
    spec = JobSpec(name="j", workers=1, command=["true"])

    def job(id: str, status: str, nodes: list[str]) -> JobRecord:
        return JobRecord(id=id, spec=spec, submitted_at=0.0, status=status,  # type: ignore[arg-type]
                         slots=[WorkerSlot(rank=i, node=n, gpus=1) for i, n in enumerate(nodes)])

    jobs = [job("j1", "running", ["a", "b"]), job("j2", "completed", ["a"]),
            job("j3", "stopping", ["a"]), job("j4", "pending", [])]
    assert busy_jobs(jobs, "a") == ["j1", "j3"] and busy_jobs(jobs, "c") == []


def test_embedded_hosts_plan_without_kubernetes() -> None:
    plan = make_plan(None, local_hosts(2), old_files={}, new_files={})
    assert [c.action for c in plan.nodes] == ["add", "add"] and not plan.cluster


@pytest.mark.timeout(300)
def test_apply_runs_the_playbook_through_ansible_runner(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(HOSTS))
    kubespray = release_files(tmp_path / "kubespray")
    (kubespray / "cluster.yml").write_text(
        "- hosts: k8s_cluster\n  gather_facts: false\n  tasks:\n"
        "    - name: touch a marker per node\n"
        "      ansible.builtin.copy: {content: '{{ kube_version }}', "
        f"dest: '{tmp_path}/{{{{ inventory_hostname }}}}.done'}}\n")
    out = tmp_path / "out"
    local = ["-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}"]
    plan = run_cli("bootstrap", "plan", str(path), "--out", str(out), "--json", env=cli_env)
    assert plan.returncode == 0, plan.stderr
    assert len(json.loads(plan.stdout)["nodes"]) == 3 and not out.exists()  # plan writes nothing
    result = run_cli("bootstrap", "apply", str(path), "--out", str(out),
                     *kubespray_args(kubespray), *local, env=cli_env, timeout=240)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "touch a marker per node" in result.stdout
    assert "provisioned: cp-1, gpu-1, gpu-2" in result.stdout
    assert (tmp_path / "gpu-2.done").read_text() == "1.34.3"
    # Kubespray's Ansible ran it, with the platform's own off PATH.
    env_bin = str(ansible_env(kubespray) / "bin")
    (program, path_var, argv), = [c for c in calls(kubespray) if "cluster.yml" in c[2]]
    assert program == f"{env_bin}/ansible-playbook" and "cluster.yml" in argv
    assert path_var.split(":")[0] == env_bin and str(BIN) not in path_var.split(":")
    again = run_cli("bootstrap", "plan", str(path), "--out", str(out), env=cli_env)
    assert again.stdout.startswith("no changes"), again.stdout


def test_bad_input_never_half_applies(tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({**HOSTS, "nodes": HOSTS["nodes"][1:]}))  # type: ignore[index]
    out = tmp_path / "out"
    result = run_cli("bootstrap", "apply", str(path), "--out", str(out), env=cli_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "no node has the role control-plane" in result.stderr and not out.exists()
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(HOSTS))
    result = run_cli("bootstrap", "apply", str(good), "--out", str(out), "--kubespray",
                     str(tmp_path / "nope"), env=cli_env)
    assert result.returncode == 1 and "nope: no such directory" in result.stderr
    no_playbook = release_files(tmp_path / "ks")
    result = run_cli("bootstrap", "apply", str(good), "--out", str(out),
                     *kubespray_args(no_playbook), env=cli_env)
    assert result.returncode == 1 and "no cluster.yml there" in result.stderr
    assert not out.exists()


def test_the_service_verb_still_runs_without_an_action() -> None:
    from cli.main import build_parser

    args = build_parser().parse_args(["bootstrap", "--hosts", str(ROOT / "examples/hosts.yaml")])
    assert args.action is None and args.hosts.endswith("hosts.yaml")


def test_files_only_apply_does_not_count_as_provisioned(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(HOSTS))
    out = tmp_path / "out"
    result = run_cli("bootstrap", "apply", str(path), "--out", str(out), env=cli_env)
    assert result.returncode == 0 and "provision with --kubespray" in result.stdout
    assert (out / "inventory/lab/hosts.yaml").is_file()
    again = json.loads(run_cli("bootstrap", "plan", str(path), "--out", str(out), "--json",
                               env=cli_env).stdout)
    assert len(again["nodes"]) == 3 and again["files"] == []  # nodes still to provision
