"""The Kubespray release a checkout holds, what it lets a hosts file ask
for, and the Ansible its playbooks run with; the order of control-plane
members, the DNS domain and host names — each through ``bootstrap plan``
as an operator runs it, with the file, line, field and fix."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.inventory import HostsFile
from libs.kubespray import RELEASES, UnsupportedRelease, release_for
from libs.settings import Settings
from services.bootstrap.ansible_env import AnsibleEnv, AnsibleEnvError, env_for
from services.bootstrap.kubespray_checkout import CHECKSUMS, read_release
from services.bootstrap.plan import DNS_DOMAIN_FLAG, FIRST_CONTROL_PLANE_FLAG, Plan, make_plan
from services.bootstrap.render import render
from tests.bootstrap.kubespray_dir import release_files
from tests.helpers import run_cli

BIN = Path(sys.executable).parent


def lab(*nodes: dict[str, Any], **kubernetes: Any) -> dict[str, Any]:
    return {"cluster": "lab", "provision": True, "kubernetes": kubernetes, "nodes": list(nodes)}


def node(name: str, ip: str, *roles: str) -> dict[str, Any]:
    return {"name": name, "ip": ip, "roles": list(roles) or ["worker"], "gpu_model": "MI300X",
            "gpu_count": 8}


CP = [node("cp-1", "10.0.0.1", "control-plane", "etcd"),
      node("cp-2", "10.0.0.2", "control-plane", "etcd"),
      node("cp-3", "10.0.0.3", "control-plane", "etcd")]
WORKERS = [node(f"gpu-{i}", f"10.0.0.{10 + i}") for i in range(1, 5)]


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ------------------------------------------------------------------ releases


def test_the_release_comes_from_the_checkout_and_unsupported_ones_are_refused(
        tmp_path: Path) -> None:
    assert read_release(release_files(tmp_path / "a", "2.31.0")).name == "Kubespray v2.31.0"
    assert read_release(release_files(tmp_path / "b", "2.30.1")).series == "2.30"
    with pytest.raises(UnsupportedRelease, match=r"v2\.29\.1 is not supported; check out one "
                       r"of v2\.30\.x, v2\.31\.x"):
        read_release(release_files(tmp_path / "c", "2.29.1"))
    bare = tmp_path / "d"
    bare.mkdir()
    with pytest.raises(UnsupportedRelease, match="cannot tell which Kubespray release"):
        read_release(bare)
    # No galaxy.yml: the release tag checked out says it.
    git = ["git", "-C", str(bare), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (bare / "cluster.yml").write_text("[]\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)
    subprocess.run([*git, "tag", "v2.30.0"], check=True)
    assert read_release(bare).name == "Kubespray v2.30.0"


def test_a_patch_release_brings_its_own_kubernetes_versions(tmp_path: Path) -> None:
    """v2.31.1's checksums.yml lists patches the pinned v2.31.0 table lacks:
    the checkout's list is the one used."""
    checkout = release_files(tmp_path / "ks", "2.31.1")
    (checkout / CHECKSUMS).parent.mkdir(parents=True)
    versions = {"1.35.5": "aa", "1.35.4": "bb", "1.34.8": "cc", "1.33.0": "dd"}
    (checkout / CHECKSUMS).write_text(yaml.safe_dump(
        {"kubelet_checksums": {"amd64": versions, "arm64": versions}}, sort_keys=False))
    release = read_release(checkout)
    assert release.kube_versions == ("1.35.5", "1.35.4", "1.34.8", "1.33.0")
    assert release.kube_version_value(None) == "1.35.5"
    assert release.kube_version_problem("1.35.3") is not None  # not in this checkout


def test_kube_version_is_written_in_the_form_of_the_release() -> None:
    hosts = HostsFile.model_validate(lab(*CP, version="v1.34.3"))
    for release in RELEASES.values():
        k8s = yaml.safe_load(render(hosts, release)[
            "inventory/lab/group_vars/k8s_cluster/k8s-cluster.yml"])
        assert k8s["kube_version"] == "1.34.3"  # v2.28 and later: no "v"
    older = release_for("2.31.0").__class__(series="2.27", kube_versions=("1.31.4", "1.29.0"),
                                            ansible_core=("2.16.4", "2.17.0"),
                                            kube_version_v_prefix=True)
    assert older.kube_version_value("1.31.4") == "v1.31.4"
    default = HostsFile.model_validate(lab(*CP))
    k8s = yaml.safe_load(render(default, RELEASES["2.30"])[
        "inventory/lab/group_vars/k8s_cluster/k8s-cluster.yml"])
    assert k8s["kube_version"] == RELEASES["2.30"].kube_versions[0] == "1.34.3"


def test_plan_refuses_a_version_the_release_cannot_build_naming_its_range(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    path = write(tmp_path / "hosts.yaml", lab(*CP, *WORKERS, version="v1.30.4"))
    checkout = release_files(tmp_path / "ks", "2.31.0")
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                     "--kubespray", str(checkout), env=cli_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "field 'kubernetes.version': Kubernetes 1.30.4 is not supported by Kubespray " \
           "v2.31.0, which builds 1.33.0 to 1.35.4" in result.stderr
    assert f"{path}: " in result.stderr and "line " in result.stderr
    # The same file against v2.30 says v2.30's range; a supported one plans.
    older = release_files(tmp_path / "ks30", "2.30.0")
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                     "--kubespray", str(older), env=cli_env)
    assert "which builds 1.32.0 to 1.34.3" in result.stderr
    write(path, lab(*CP, *WORKERS, version="1.33.7"))
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                     "--kubespray", str(older), env=cli_env)
    assert result.returncode == 0, result.stderr
    assert "rendered for Kubespray v2.30.0" in result.stdout
    unsupported = release_files(tmp_path / "ks29", "2.29.1")
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                     "--kubespray", str(unsupported), env=cli_env)
    assert result.returncode == 1 and "supported: " not in result.stderr
    assert "v2.29.1 is not supported; check out one of v2.30.x, v2.31.x" in result.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------- control plane order


def test_members_keep_the_order_of_the_hosts_file() -> None:
    late = node("aa-cp-4", "10.0.0.4", "control-plane", "etcd")
    doc = lab(*CP, late, node("aa-cp-5", "10.0.0.5", "control-plane", "etcd"), *WORKERS)
    inventory = yaml.safe_load(render(HostsFile.model_validate(doc))["inventory/lab/hosts.yaml"])
    groups = inventory["all"]["children"]
    assert list(groups["kube_control_plane"]["hosts"]) == [
        "cp-1", "cp-2", "cp-3", "aa-cp-4", "aa-cp-5"]
    assert list(groups["etcd"]["hosts"]) == ["cp-1", "cp-2", "cp-3", "aa-cp-4", "aa-cp-5"]
    assert list(groups["kube_node"]["hosts"]) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]


def _plan(old: dict[str, Any], new: dict[str, Any], **old_files: str) -> Plan:
    before, after = HostsFile.model_validate(old), HostsFile.model_validate(new)
    files = render(before)
    files |= {f"inventory/lab/group_vars/{k.replace('__', '/')}.yml": v
              for k, v in old_files.items()}
    return make_plan(before, after, old_files=files, new_files=render(after))


def test_only_a_change_of_the_first_control_plane_node_is_a_hazard() -> None:
    late = node("aa-cp-4", "10.0.0.4", "control-plane")
    assert _plan(lab(*CP, *WORKERS), lab(*CP, late, *WORKERS)).hazards == ()  # appended
    (first,) = _plan(lab(*CP, *WORKERS), lab(late, *CP, *WORKERS)).hazards
    assert first.flag == FIRST_CONTROL_PLANE_FLAG
    assert first.message.startswith("kube_control_plane[0] would change from cp-1 to aa-cp-4")
    replaced = node("aa-cp-4", "10.0.0.4", "control-plane", "etcd")
    (dropped,) = _plan(lab(*CP, *WORKERS), lab(*CP[1:], replaced, *WORKERS)).hazards
    assert "cp-1 is no longer in the file" in dropped.message
    assert _plan(lab(*CP, *WORKERS), lab(late, *CP, *WORKERS)).refused(
        [FIRST_CONTROL_PLANE_FLAG]) == []


def test_a_new_first_control_plane_node_is_refused_without_the_flag(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    out, path = _built(tmp_path, cli_env)
    write(path, lab(node("aa-cp-4", "10.0.0.4", "control-plane"), *CP, *WORKERS))
    before = sorted(p.read_text() for p in out.rglob("*") if p.is_file())
    result = run_cli("bootstrap", "apply", str(path), "--out", str(out), env=cli_env)
    assert result.returncode == 1
    assert "! kube_control_plane[0] would change from cp-1 to aa-cp-4" in result.stdout
    assert "refused: kube_control_plane[0] would change" in result.stderr
    assert "--allow-first-control-plane-change" in result.stderr
    assert sorted(p.read_text() for p in out.rglob("*") if p.is_file()) == before
    result = run_cli("bootstrap", "plan", str(path), "--out", str(out), "--json",
                     "--allow-first-control-plane-change", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["hazards"][0]["flag"] == FIRST_CONTROL_PLANE_FLAG


def _built(tmp_path: Path, cli_env: dict[str, str]) -> tuple[Path, Path]:
    """A 3+4-node cluster applied in ``out`` as a successful provisioning run
    leaves it (the file recorded as applied): (out, the hosts file)."""
    from services.bootstrap.provision import record_applied

    out = tmp_path / "out"
    path = write(tmp_path / "hosts.yaml", lab(*CP, *WORKERS))
    assert run_cli("bootstrap", "apply", str(path), "--out", str(out),
                   env=cli_env).returncode == 0
    record_applied(HostsFile.model_validate(yaml.safe_load(path.read_text())), out)
    return out, path


# ------------------------------------------------------------------ DNS domain


def test_the_dns_domain_is_rendered_apart_from_the_cluster_name() -> None:
    hosts = HostsFile.model_validate(lab(*CP, dns_domain="corp.internal"))
    k8s = yaml.safe_load(render(hosts)["inventory/lab/group_vars/k8s_cluster/k8s-cluster.yml"])
    assert k8s["dns_domain"] == "corp.internal" and k8s["cluster_name"] == "lab"
    with pytest.raises(ValueError, match="is not a DNS domain"):
        HostsFile.model_validate(lab(*CP, dns_domain="Corp_Internal"))


def test_the_kubernetes_driver_takes_the_domain_from_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from libs.drivers.k8s_manifests import master_addr
    from services.scheduler.app import kubernetes_config

    monkeypatch.setenv("PRIMUS_K8S_CLUSTER_DOMAIN", "corp.internal")
    settings = Settings(driver="kubernetes", k8s_image="registry/train:1")
    config = kubernetes_config(settings)
    assert config.cluster_domain == "corp.internal"
    assert master_addr("llama", 1, config).endswith(".default.svc.corp.internal")
    with pytest.raises(ValueError):
        Settings(k8s_cluster_domain="not a domain")


def test_changing_a_built_clusters_domain_is_a_hazard() -> None:
    (changed,) = _plan(lab(*CP), lab(*CP, dns_domain="corp.internal")).hazards
    assert changed.flag == DNS_DOMAIN_FLAG
    assert "DNS domain would change from cluster.local to corp.internal" in changed.message
    # A cluster rendered before dns_domain existed got <cluster>.local from
    # cluster_name: that is the domain it was built with.
    legacy = {"k8s_cluster__k8s-cluster": "cluster_name: lab.local\nkube_version: v1.30.4\n"}
    (kept,) = _plan(lab(*CP), lab(*CP), **legacy).hazards
    assert "from lab.local to cluster.local" in kept.message
    assert "set kubernetes.dns_domain: lab.local to keep it" in kept.message
    assert _plan(lab(*CP), lab(*CP, dns_domain="lab.local"), **legacy).hazards == ()


def test_changing_a_built_clusters_domain_is_refused_without_the_flag(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    out, path = _built(tmp_path, cli_env)
    write(path, lab(*CP, *WORKERS, dns_domain="corp.internal"))
    result = run_cli("bootstrap", "plan", str(path), "--out", str(out), env=cli_env)
    assert result.returncode == 1
    assert "DNS domain would change from cluster.local to corp.internal" in result.stderr
    result = run_cli("bootstrap", "plan", str(path), "--out", str(out),
                     "--allow-dns-domain-change", env=cli_env)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ host names


def test_every_bad_host_name_is_listed_with_its_fix(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    bad = [node("GPU_004", "10.0.0.44"), node("-edge-", "10.0.0.45"),
           node("gpu." + "x" * 70, "10.0.0.46")]
    path = write(tmp_path / "hosts.yaml", lab(*CP, *bad))
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"), env=cli_env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "3 problem(s)" in result.stderr
    assert "field 'nodes.3.name': 'GPU_004' is not a host name" in result.stderr
    assert "write 'gpu-004'" in result.stderr and "write 'edge'" in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "nodes.5.name" in ln]
    assert lines and "line " in lines[0] and f"write 'gpu-{'x' * 59}'" in lines[0]
    assert not (tmp_path / "out").exists()
    # Files that do not ask for provisioning name existing nodes: kept as they are.
    HostsFile.model_validate({"cluster": "lab", "nodes": [node("GPU_004", "10.0.0.44")]})


def test_too_many_nodes_for_the_pod_range_is_said_at_plan_time(
        tmp_path: Path, cli_env: dict[str, str]) -> None:
    many = [node(f"gpu-{i}", f"10.1.0.{i + 1}") for i in range(70)]
    path = write(tmp_path / "hosts.yaml", lab(*CP, *many, network_plugin="cilium"))
    result = run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"), env=cli_env)
    assert result.returncode == 1
    assert ("field 'kubernetes.pod_cidr': 10.233.64.0/18 split into /24 per node holds 64 "
            "node(s), but 73 join the cluster (cilium); widen it to /17") in result.stderr
    write(path, lab(*CP, *many, network_plugin="calico"))  # calico allocates blocks on demand
    assert run_cli("bootstrap", "plan", str(path), "--out", str(tmp_path / "out"),
                   env=cli_env).returncode == 0


# -------------------------------------------------------------- Ansible environment


def test_an_environment_is_built_once_per_checkout_and_requirements(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "ks"
    checkout.mkdir()
    (checkout / "requirements.txt").write_text("# nothing to install\n")
    lines: list[str] = []
    env = env_for(checkout, home=tmp_path / "envs", on_line=lines.append)
    assert (env.root / "bin" / "python").exists() and lines
    marker = (env.root / "primus-kubespray-env.txt").stat().st_mtime_ns
    again = env_for(checkout, home=tmp_path / "envs", on_line=lines.append)
    assert again == env and (env.root / "primus-kubespray-env.txt").stat().st_mtime_ns == marker
    (checkout / "requirements.txt").write_text("# another release\n")
    assert env_for(checkout, home=tmp_path / "envs").root != env.root
    # An install that fails says so, with pip's own words, and is rebuilt next time.
    (checkout / "requirements.txt").write_text("primus-no-such-package==1.0\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(AnsibleEnvError, match="(?s)pip install -r .* failed.*"
                       "primus-no-such-package"):
        env_for(checkout, home=tmp_path / "envs")


def test_an_environment_outside_the_releases_ansible_range_is_refused(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for tool in ("ansible", "ansible-playbook"):
        (venv / "bin" / tool).symlink_to(BIN / tool)
    env = AnsibleEnv(venv)
    found = env.core_version()
    assert found == version("ansible-core")  # the platform's own, newer than v2.31 takes
    with pytest.raises(AnsibleEnvError, match=r"Kubespray v2\.31 needs ansible-core >= 2\.18\.0 "
                       rf"and < 2\.19\.0; {venv} has {found}"):
        env.check(RELEASES["2.31"])
    with pytest.raises(AnsibleEnvError, match="no ansible-playbook"):
        AnsibleEnv(tmp_path / "empty").check(RELEASES["2.31"])
    path = env.envvars(f"{BIN}:/usr/bin")["PATH"].split(":")
    assert path == [str(venv / "bin"), "/usr/bin"]  # the platform's venv is off PATH


def test_the_runner_is_given_the_environments_ansible_first_on_path(tmp_path: Path) -> None:
    from services.bootstrap.provision import run_playbook
    from tests.bootstrap.kubespray_dir import ansible_env, calls, make_kubespray

    checkout = make_kubespray(tmp_path / "ks", tmp_path / "record")
    hosts = HostsFile.model_validate(lab(node("cp-1", "127.0.0.1", "control-plane", "etcd")))
    for rel, text in render(hosts).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = AnsibleEnv(ansible_env(checkout))
    result = run_playbook(env=env, project_dir=checkout, playbook="cluster.yml",
                          inventory=tmp_path / "inventory/lab/hosts.yaml",
                          on_progress=lambda _: None,
                          extravars={"ansible_connection": "local",
                                     "ansible_python_interpreter": sys.executable})
    assert result.rc == 0 and result.ok_hosts == ("cp-1",)
    # What ansible-runner was told, and what actually ran.
    assert result.command[0] == "ansible-playbook" and "cluster.yml" in result.command
    assert result.path.split(":")[0] == str(env.bin) and str(BIN) not in result.path.split(":")
    ((program, path, argv),) = calls(checkout)
    assert program == str(env.playbook) and path == result.path and "cluster.yml" in argv
