"""A job's workload settings against its workspace (pure): defaults fill
what the job leaves unset (job > workspace > cluster), limits refuse what is
above them with the limit and the field named, a Kubernetes job without a
shared checkpoint volume is warned, and the local driver names what it
ignores. Scenarios as data."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from libs.events import JobSpec
from libs.specs import SpecError, load_model
from libs.workload import kubernetes_only
from services.scheduler.config import SchedulerFile, WorkloadDefaults, WorkspaceConfig
from services.scheduler.workload import resolve

CLUSTER = WorkloadDefaults.model_validate({
    "image": "registry/base:1.0", "network": {"socket_ifname": "eth0"},
    "env": {"NCCL_DEBUG": "WARN"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "image_pull_secrets": ["cluster-cred"]})
LLM = WorkspaceConfig.model_validate({
    "name": "llm",
    "workload": {"image": "registry/llm:2.0", "checkpoint_pvc": "llm-ckpt",
                 "resources": {"cpu": "96", "memory": "1536Gi", "shared_memory": "256Gi",
                               "extra": {"rdma/hca": 1}},
                 "network": {"ib_hca": "mlx5_0", "ib_gid_index": 3},
                 "node_selector": {"pool": "llm"}, "image_pull_secrets": ["llm-cred"]},
    "limits": {"cpu": "128", "memory": "1792Gi", "shared_memory": "512Gi",
               "extra": {"rdma/hca": 1}, "host_network": True,
               "host_paths": ["/mnt/datasets"]}})
PLAIN = WorkspaceConfig(name="default")


def job(**over: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "workers": 2, "gpus_per_worker": 8,
                                   "command": ["x"], "workspace": "llm", **over})


def test_defaults_fill_what_the_job_leaves_unset() -> None:
    r = resolve(job(env={"NCCL_DEBUG": "INFO"}, resources={"memory": "1024Gi"},
                    node_selector={"zone": "a"}), LLM, CLUSTER, kubernetes=True)
    assert r.spec is not None and not r.warnings
    s = r.spec
    assert s.image == "registry/llm:2.0"  # the workspace's beats the cluster's
    assert (s.resources.cpu, s.resources.memory, s.resources.shared_memory) == (
        "96", "1024Gi", "256Gi")  # the job's memory, the rest from the workspace
    assert s.resources.extra == {"rdma/hca": 1}
    assert s.env == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0",
                     "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3",
                     "NCCL_DEBUG": "INFO"}  # the job's own value wins
    assert s.node_selector == {"pool": "llm", "zone": "a"}
    assert [t.key for t in s.tolerations] == ["gpu"]
    assert s.image_pull_secrets == ["cluster-cred", "llm-cred"]
    assert s.checkpoint_pvc == "llm-ckpt" and s.host_network is False


def test_the_jobs_own_choices_win() -> None:
    r = resolve(job(image="mine:3", checkpoint_pvc="my-ckpt", host_network=True), LLM, CLUSTER,
                kubernetes=True)
    assert r.spec is not None
    assert (r.spec.image, r.spec.checkpoint_pvc, r.spec.host_network) == (
        "mine:3", "my-ckpt", True)


@pytest.mark.parametrize(("over", "field", "says"), [
    ({"resources": {"memory": "2Ti"}}, "resources.memory",
     "resources.memory 2Ti is above workspace llm's limit of 1792Gi per worker (limits.memory)"),
    ({"resources": {"cpu": "129"}}, "resources.cpu", "limit of 128 per worker (limits.cpu)"),
    ({"resources": {"extra": {"rdma/hca": 2}}}, "resources.extra",
     "resources.extra rdma/hca: 2 is above workspace llm's limit of 1 per worker"),
    ({"resources": {"extra": {"xilinx.com/fpga": 1}}}, "resources.extra",
     "resource xilinx.com/fpga is not allowed in workspace llm (limits.extra allows: rdma/hca)"),
    ({"volumes": [{"name": "d", "host_path": "/etc", "mount_path": "/d"}]},
     "volumes.0.host_path", "host_path /etc is not allowed in workspace llm "
                            "(limits.host_paths allows: /mnt/datasets)"),
    ({"volumes": [{"name": "d", "host_path": "/mnt/datasets-evil", "mount_path": "/d"}]},
     "volumes.0.host_path", "not allowed"),
])
def test_above_a_limit_is_refused_with_the_limit_named(over: dict[str, Any], field: str,
                                                       says: str) -> None:
    r = resolve(job(**over), LLM, CLUSTER, kubernetes=True)
    assert r.spec is None and r.field == field and says in r.reason, r.reason


def test_within_the_limits_and_allowed_paths() -> None:
    r = resolve(job(host_network=True, volumes=[
        {"name": "d", "host_path": "/mnt/datasets/c4", "mount_path": "/d"}]), LLM, CLUSTER,
        kubernetes=True)
    assert r.spec is not None


def test_a_workspace_without_limits_forbids_host_network_and_host_paths() -> None:
    r = resolve(job(workspace="default", host_network=True), PLAIN, WorkloadDefaults(),
                kubernetes=False)
    assert r.spec is None and "does not allow host_network" in r.reason
    r = resolve(job(workspace="default", volumes=[
        {"name": "d", "host_path": "/data", "mount_path": "/d"}]), PLAIN, WorkloadDefaults(),
        kubernetes=False)
    assert r.spec is None and "limits.host_paths allows: none" in r.reason


def test_kubernetes_without_a_shared_checkpoint_volume_warns() -> None:
    r = resolve(job(workspace="default"), PLAIN, WorkloadDefaults(), kubernetes=True)
    assert r.spec is not None
    assert r.warnings and "starts from scratch" in r.warnings[0]
    assert not resolve(job(workspace="default"), PLAIN, WorkloadDefaults(), kubernetes=True,
                       fallback_checkpoint_pvc="cluster-ckpt").warnings
    assert not resolve(job(workspace="default"), PLAIN, WorkloadDefaults(),
                       kubernetes=False).warnings


def test_the_local_driver_names_what_it_ignores() -> None:
    assert kubernetes_only(job()) == []
    r = resolve(job(volumes=[{"name": "d", "pvc": "data", "mount_path": "/d"}]), LLM, CLUSTER,
                kubernetes=False)
    assert r.spec is not None
    assert kubernetes_only(r.spec) == ["image", "resources", "volumes", "node_selector",
                                       "tolerations", "image_pull_secrets", "checkpoint_pvc"]


@pytest.mark.parametrize(("body", "says"), [
    ("resources: {extra: {rdma hca: 1}}", "unknown resource name 'rdma hca'"),
    ("resources: {extra: {amd.com/gpu: 8}}", "GPUs are asked for with gpus_per_worker"),
    ("resources: {memory: lots}", "'lots' is not a quantity"),
    ("resources: {memory: 1Gi, shared_memory: 2Gi}", "is more than memory"),
    ("volumes: [{name: data, pvc: data}]", "field 'volumes.0.mount_path': Field required"),
    ("volumes: [{name: data, mount_path: /d}]", "give exactly one of pvc"),
    ("volumes: [{name: data, mount_path: d, pvc: x}]", "must be an absolute path"),
    ("volumes: [{name: dshm, mount_path: /d, pvc: x}]", "is the platform's own"),
    ("volumes: [{name: a, mount_path: /dev/shm, pvc: x}]", "mounted by the platform"),
    ("secrets: [{name: hf}]", "give env (variable: key) or mount_path"),
    ("secrets: [{name: Bad_Name, env: {X: y}}]", "is not a Kubernetes object name"),
    ("node_selector: {'bad key!': x}", "label key"),
    ("tolerations: [{operator: Exists, value: x}]", "takes no value"),
    ("image: 'two words'", "is not an image reference"),
])
def test_bad_workload_fields_name_the_line_and_field(tmp_path: Any, body: str,
                                                     says: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nworkers: 1\ncommand: [x]\n{body}\n")
    with pytest.raises(SpecError) as err:
        load_model(path, JobSpec)
    text = str(err.value)
    assert says in text and "line 4" in text, text


def test_limits_and_defaults_are_checked_when_the_configuration_loads() -> None:
    with pytest.raises(ValidationError, match="is not a quantity"):
        SchedulerFile.model_validate({"workspaces": [{"name": "a",
                                                      "limits": {"memory": "much"}}]})
    with pytest.raises(ValidationError, match="host_paths must be absolute"):
        SchedulerFile.model_validate({"workspaces": [{"name": "a",
                                                      "limits": {"host_paths": ["data"]}}]})


def test_resume_step_placeholder_is_refused_on_kubernetes_only() -> None:
    s = job(command=["torchrun", "x.py", "--iteration", "{resume_step}"])
    r = resolve(s, LLM, CLUSTER, kubernetes=True)
    assert r.spec is None and r.field == "command" and "--load {checkpoint_dir}" in r.reason
    assert resolve(s, LLM, CLUSTER, kubernetes=False).spec is not None


def test_an_unquoted_placeholder_says_to_quote_it(tmp_path: Any) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\nworkers: 1\ncommand: [torchrun, x.py, --load, {checkpoint_dir}]\n")
    with pytest.raises(SpecError, match='command\\[3\\] is a YAML mapping, not text: quote it, '
                                        '"\\{checkpoint_dir\\}"'):
        load_model(path, JobSpec)
