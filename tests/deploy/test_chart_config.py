"""The services' configuration files through the chart.

values -> ConfigMap -> file mounted read-only -> the setting that names it ->
the very loader the service runs. values.schema.json holds each file's
schema, generated from the service's model (cli/chart_schema.py), so helm
refuses what the service would refuse; a test fails when it drifts.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_helpers import (
    CHART,
    KUBE_VERSIONS,
    RELEASE,
    Renderer,
    by_kind,
    main_container,
    mounted_file,
    run_helm,
    workloads,
)
from pydantic import BaseModel, Field, ValidationError
from scenarios import SCENARIOS

from cli import chart_schema
from services.bench.config import BenchConfig, ConfigFile
from services.failover.app import load_rules
from services.failover.faults import FailoverRules
from services.lens_collector.alerts import AlertConfig
from services.lens_collector.app import load_alerts
from services.scheduler import config as scheduler_config
from services.scheduler.config import SchedulerFile

CONFIGURED = SCENARIOS["external-services"]  # every file with non-default values


def _scheduler(path: Path) -> BaseModel:
    return scheduler_config.load(path)


def _bench(path: Path) -> BaseModel:
    file = ConfigFile(path)
    assert file.error is None, file.error  # ConfigFile keeps the defaults on a bad file
    return file.current


# (workloads that read it, setting, values path, loader the service runs, model)
FILES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], Any, type[BaseModel]]] = {
    "scheduler": (("scheduler",), "PRIMUS_SCHEDULER_CONFIG", ("scheduler", "config"),
                  _scheduler, SchedulerFile),
    "failover": (("failover",), "PRIMUS_FAILOVER_RULES", ("failover", "rules"),
                 load_rules, FailoverRules),
    "lens": (("lens-collector",), "PRIMUS_LENS_ALERTS_FILE", ("lensCollector", "alertRules"),
             load_alerts, AlertConfig),
    "bench": (("bench-agent", "bench-coordinator"), "PRIMUS_BENCH_CONFIG", ("bench", "config"),
              _bench, BenchConfig),
}


def chart_default(*keys: str) -> Any:
    node: Any = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in keys:
        node = node[key]
    return node


def value(values: dict[str, Any], keys: tuple[str, ...]) -> Any:
    node: Any = values
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return chart_default(*keys)
        node = node[key]
    return node


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in main_container(workload)["env"]}


def mounted_text(objects: list[dict[str, Any]], workload: dict[str, Any], path: str) -> str:
    """The text a pod reads at path: mount -> volume -> ConfigMap -> key."""
    volume, key = mounted_file(workload, path)
    mount = next(m for m in main_container(workload)["volumeMounts"]
                 if path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount.get("readOnly") is True, mount
    assert "subPath" not in mount  # kubelet updates only whole-directory mounts in place
    return by_kind(objects, "ConfigMap")[volume["configMap"]["name"]]["data"][key]


# ------------------------------------------------------ values -> loaders ---


@pytest.mark.parametrize("scenario", ["defaults", "external-services"])
@pytest.mark.parametrize("name", FILES)
def test_each_file_is_mounted_where_the_setting_points_and_loads_as_values_said(
    render: Renderer, tmp_path: Path, scenario: str, name: str
) -> None:
    readers, setting, keys, loader, model = FILES[name]
    values = SCENARIOS[scenario]
    objects = render(values)
    found = workloads(objects)
    texts = set()
    for verb in readers:
        env = env_of(found[verb])
        path = env[setting]["value"]
        assert path.startswith("/etc/primus-safe/")
        texts.add(mounted_text(objects, found[verb], path))
    (text,) = texts  # agents and coordinator read one and the same file
    wanted = value(values, keys)
    assert yaml.safe_load(text) == wanted
    file = tmp_path / Path(path).name
    file.write_text(text)
    loaded = loader(file)
    assert isinstance(loaded, model)
    assert loaded == model.model_validate(wanted)
    # Nobody else gets the setting.
    for verb, workload in found.items():
        if verb not in readers:
            assert setting not in env_of(workload), (verb, setting)


def test_non_default_values_reach_the_services(render: Renderer, tmp_path: Path) -> None:
    """Spot checks that the configured scenario is not the defaults in disguise."""
    objects = render(CONFIGURED)
    found = workloads(objects)

    def load(verb: str, setting: str, loader: Any) -> Any:
        path = env_of(found[verb])[setting]["value"]
        file = tmp_path / f"{verb}.yaml"
        file.write_text(mounted_text(objects, found[verb], path))
        return loader(file)

    scheduler = load("scheduler", "PRIMUS_SCHEDULER_CONFIG", _scheduler)
    assert [w.name for w in scheduler.workspaces] == ["research", "prod"]
    assert scheduler.workspaces[0].quota_gpus == 64
    assert scheduler.pool_capacity() == {"mi300x": {"MI300X": 256}}
    assert scheduler.limits().preemption_grace_s == 45
    rules = load("failover", "PRIMUS_FAILOVER_RULES", load_rules)
    assert rules.rule("heartbeat_missed").consecutive == 2
    assert rules.rule("probe_failed") is None  # a list replaces the built-in one
    alerts = load("lens-collector", "PRIMUS_LENS_ALERTS_FILE", load_alerts)
    assert alerts.gpu_temp_c.above == 85 and alerts.job_hang_s == 900
    bench = load("bench-agent", "PRIMUS_BENCH_CONFIG", _bench)
    assert [p.kind for p in bench.probes] == ["gpu_power"]
    assert bench.standard.gpu_membw_bytes == 4294967296  # a large int stays an int
    assert bench.floors_for("AMD Instinct MI300X") == {"gemm_bf16_8192_tflops": 500.5}


def test_default_render_turns_gpu_probes_on(render: Renderer, tmp_path: Path) -> None:
    objects = render()
    agent = workloads(objects)["bench-agent"]
    path = env_of(agent)["PRIMUS_BENCH_CONFIG"]["value"]
    file = tmp_path / "bench.yaml"
    file.write_text(mounted_text(objects, agent, path))
    probes = {p.kind: p for p in _bench(file).probes}
    assert set(probes) == {"gpu_temperature", "gpu_ecc", "gpu_count"}
    assert probes["gpu_temperature"].interval_s == 30
    assert probes["gpu_ecc"].interval_s == probes["gpu_count"].interval_s == 60
    assert "gemm" not in probes  # never a GPU load on a node that may be training
    assert BenchConfig().probes == []  # the code's own default stays off (local runs)


def test_files_read_once_roll_their_pods_and_the_bench_config_does_not(
    render: Renderer,
) -> None:
    """The scheduler, failover and lens-collector read their file at start: a
    change changes their checksum annotation and so rolls them. The agents and
    the coordinator re-read the bench config (ConfigFile, by mtime), so a
    change must not restart the agent on every GPU node."""
    default, configured = workloads(render()), workloads(render(CONFIGURED))

    def checksum(found: dict[str, Any], verb: str) -> str | None:
        return found[verb]["spec"]["template"]["metadata"]["annotations"].get(
            "checksum/config")

    for verb in ("scheduler", "failover", "lens-collector"):
        assert checksum(default, verb) and checksum(configured, verb)
        assert checksum(default, verb) != checksum(configured, verb), verb
    for verb in ("bench-agent", "bench-coordinator"):
        assert checksum(default, verb) is None and checksum(configured, verb) is None


# ---------------------------------------------------------- checkpoints ---


@pytest.mark.parametrize(("scenario", "claim", "created"), [
    ("defaults", f"{RELEASE}-primus-safe-checkpoints", True),
    ("existing-secret", "ckpt", True),               # the chart's, under the operator's name
    ("external-services", "training-checkpoints", False),  # an existing claim
    ("nats-cluster", None, False),                  # none at all
])
def test_checkpoint_claim(render: Renderer, scenario: str, claim: str | None,
                          created: bool) -> None:
    objects = render(SCENARIOS[scenario])
    env = env_of(workloads(objects)["scheduler"])
    assert env.get("PRIMUS_K8S_CHECKPOINT_PVC", {}).get("value") == claim
    claims = by_kind(objects, "PersistentVolumeClaim")
    assert (claim in claims) == created
    assert not [n for n in claims if "checkpoints" in n and n != claim]
    if created:
        pvc = claims[claim]
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
        assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        wanted = SCENARIOS[scenario].get("checkpoints", {})
        assert pvc["spec"]["resources"]["requests"]["storage"] == wanted.get("size", "1Ti")
        assert pvc["spec"].get("storageClassName") == wanted.get("storageClassName")
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(pvc, version, strict=True)


# --------------------------------------------------------- bad values ---


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "negative quota": (
        {"scheduler": {"config": {"workspaces": [{"name": "a", "quota_gpus": -1}]}}},
        "/scheduler/config/workspaces/0/quota_gpus"),
    "unknown workspace key": (
        {"scheduler": {"config": {"workspaces": [{"name": "a", "quota": 8}]}}},
        "additional properties 'quota' not allowed"),
    "unknown scheduler key": (
        {"scheduler": {"config": {"preemtion": False}}},
        "additional properties 'preemtion' not allowed"),
    "no workspace": (
        {"scheduler": {"config": {"workspaces": []}}}, "/scheduler/config/workspaces"),
    "bad queue policy": (
        {"scheduler": {"config": {"workspaces": [{"name": "a", "queue_policy": "lifo"}]}}},
        "/scheduler/config/workspaces/0/queue_policy"),
    "bad fault scope": (
        {"failover": {"rules": {"rules": [{"kind": "bench_failed", "scope": "rack"}]}}},
        "/failover/rules/rules/0/scope"),
    "zero consecutive": (
        {"failover": {"rules": {"rules": [{"kind": "bench_failed", "consecutive": 0}]}}},
        "/failover/rules/rules/0/consecutive"),
    "alert ratio above 1": (
        {"lensCollector": {"alertRules": {"throughput_ratio": 1.5}}},
        "/lensCollector/alertRules/throughput_ratio"),
    "unknown probe kind": (
        {"bench": {"config": {"probes": [{"name": "fan", "kind": "gpu_fan"}]}}},
        "/bench/config/probes/0/kind"),
    "zero probe interval": (
        {"bench": {"config": {"probes": [{"name": "t", "kind": "gpu_temperature",
                                          "interval_s": 0}]}}},
        "/bench/config/probes/0/interval_s"),
    "bad claim name": ({"checkpoints": {"claimName": "Bad_Name"}}, "/checkpoints/claimName"),
    "bad access mode": ({"checkpoints": {"accessModes": ["ReadWriteSometimes"]}},
                        "/checkpoints/accessModes/0"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_configuration_is_refused_by_the_schema(
    helm: Path, values_dir: Path, case: str
) -> None:
    values, message = BAD[case]
    file = values_dir / f"bad-{case.replace(' ', '-')}.yaml"
    file.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "template", RELEASE, CHART, "--values", file)
    assert proc.returncode != 0, f"{case}: accepted"
    assert message in proc.stderr, proc.stderr


def model_section(values: dict[str, Any]) -> tuple[type[BaseModel], Any] | None:
    """The configuration model a values document sets, and its section."""
    for _readers, _setting, keys, _loader, model in FILES.values():
        node: Any = values
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return model, node
    return None


@pytest.mark.parametrize("case", [c for c in BAD if model_section(BAD[c][0])])
def test_what_the_schema_refuses_the_model_refuses(case: str) -> None:
    """The schema is the model's: the same values fail the model too."""
    found = model_section(BAD[case][0])
    assert found is not None
    model, section = found
    with pytest.raises(ValidationError):
        model.model_validate(section)


# ------------------------------------------------- schema = the models ---


def test_values_schema_is_generated_from_the_models() -> None:
    """Run `python -m cli.catalog --write` after changing a configuration model."""
    text = chart_schema.SCHEMA_FILE.read_text()
    assert chart_schema.render(text) == text, (
        "deploy/helm/primus-safe/values.schema.json is out of date with the configuration "
        "models: run python -m cli.catalog --write")


def test_the_chart_defaults_validate_against_the_models() -> None:
    for _readers, _setting, keys, _loader, model in FILES.values():
        model.model_validate(chart_default(*keys))


def test_service_entries_extend_the_shared_service_definition() -> None:
    """scheduler, failover and lensCollector are spelled out (draft-07 cannot
    extend a closed definition): they must stay the service definition plus
    their file."""
    schema = json.loads(chart_schema.SCHEMA_FILE.read_text())
    service = schema["definitions"]["service"]
    for key, file_key, ref in (("scheduler", "config", "schedulerConfig"),
                               ("failover", "rules", "failoverRules"),
                               ("lensCollector", "alertRules", "alertRules")):
        entry = copy.deepcopy(schema["properties"][key])
        extra = entry["properties"].pop(file_key)
        assert extra["$ref"] == f"#/definitions/{ref}"
        assert entry["properties"] == service["properties"], key
        assert entry["required"] == service["required"], key
        assert entry["additionalProperties"] is False
    bench = schema["properties"]["bench"]["properties"]["config"]
    assert bench["$ref"] == "#/definitions/benchConfig"


class _Inner(BaseModel):
    title: str = Field(description="a field called title is a field, not a title")


class _Outer(BaseModel):
    model_config = {"extra": "forbid"}
    inner: _Inner
    count: int = Field(default=1, ge=0)


def test_generation_follows_a_model_change_and_keeps_the_rest() -> None:
    hand = {"definitions": {"service": {"type": "object"}, "demo.Stale": {"type": "string"},
                            "demoX": {"type": "null"}},
            "properties": {"nats": {"type": "object", "description": "kept"}}}
    out = chart_schema.chart_schema(hand, {"demo": _Outer})
    defs = out["definitions"]
    assert "demo.Stale" not in defs  # a nested model that is gone
    assert defs["demoX"] == {"type": "null"}  # only demo and demo.* are generated
    assert defs["service"] == {"type": "object"} and out["properties"] == hand["properties"]
    assert defs["demo"]["x-model"].endswith("_Outer")
    assert defs["demo"]["additionalProperties"] is False
    assert defs["demo"]["properties"]["inner"] == {"$ref": "#/definitions/demo._Inner"}
    assert defs["demo"]["properties"]["count"] == {"default": 1, "minimum": 0,
                                                   "type": "integer"}
    assert "title" in defs["demo._Inner"]["properties"]  # the field survives
    assert "title" not in defs["demo._Inner"]
    assert hand["definitions"]["demo.Stale"]  # the input is not changed
