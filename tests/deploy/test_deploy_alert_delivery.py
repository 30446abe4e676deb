"""Lens alert delivery through the chart: lens.alertDelivery becomes
the receivers file in a ConfigMap, mounted into lens-collector and named by
PRIMUS_LENS_ALERT_RECEIVERS; webhook secrets come from existing Secrets
mounted read-only; the schema (the model's) refuses what the collector
would refuse, and nothing is rendered without receivers."""

from __future__ import annotations

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
    pod_spec,
    run_helm,
    workloads,
)
from pydantic import ValidationError

from libs.specs import load_model
from services.lens_collector.delivery_config import DeliveryConfig, load_delivery

SECRET_FILE = "/etc/primus-safe/lens-secrets/pager-hmac/secret"
DELIVERY: dict[str, Any] = {
    "receivers": [
        {"name": "am", "kind": "alertmanager", "url": "http://alertmanager.monitoring:9093"},
        {"name": "pager", "kind": "webhook", "url": "https://pager.example/primus",
         "secret": {"file": SECRET_FILE}, "max_attempts": 8,
         "backoff": {"initial_s": 2, "max_s": 120}},
    ],
    "routes": [{"matchers": ["severity=critical"], "receivers": ["pager", "am"],
                "continue": True}],
    "dashboard_url": "https://grafana.example/d/primus-job?var-job={job}",
}
CONFIGURED = {"lens": {"alertDelivery": DELIVERY, "alertDeliverySecrets": ["pager-hmac"]}}


def _collector(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return workloads(objects)["lens-collector"]


def test_without_receivers_nothing_is_rendered(render: Renderer) -> None:
    objects = render({})
    env = {e["name"] for e in main_container(_collector(objects))["env"]}
    assert "PRIMUS_LENS_ALERT_RECEIVERS" not in env
    assert not [n for n in by_kind(objects, "ConfigMap") if "alert-receivers" in n]


def test_receivers_become_a_mounted_file_the_collector_loads(render: Renderer,
                                                            tmp_path: Path) -> None:
    objects = render(CONFIGURED)
    collector = _collector(objects)
    env = {e["name"]: e for e in main_container(collector)["env"]}
    path = env["PRIMUS_LENS_ALERT_RECEIVERS"]["value"]
    assert path == "/etc/primus-safe/lens-delivery/receivers.yaml"
    volume, key = mounted_file(collector, path)
    config_map = by_kind(objects, "ConfigMap")[volume["configMap"]["name"]]
    text = config_map["data"][key]
    assert yaml.safe_load(text) == DELIVERY
    # The Secret is mounted where the receiver reads its key.
    secret_volume, secret_key = mounted_file(collector, SECRET_FILE)
    assert secret_volume["secret"]["secretName"] == "pager-hmac" and secret_key == "secret"
    mounts = {m["mountPath"]: m for m in main_container(collector)["volumeMounts"]}
    assert mounts["/etc/primus-safe/lens-secrets/pager-hmac"]["readOnly"] is True
    # The very loader the collector runs, with the Secret's key where it is mounted.
    local = tmp_path / "receivers.yaml"
    local.write_text(text.replace(SECRET_FILE, str(tmp_path / "secret")))
    (tmp_path / "secret").write_text("hmac-key")
    config, secrets = load_delivery(local)
    assert [r.name for r in config.receivers] == ["am", "pager"] and secrets == {
        "pager": b"hmac-key"}
    # A change of receivers rolls the pods.
    other = render({"lens": {**CONFIGURED["lens"], "alertDelivery": {
        **DELIVERY, "dashboard_url": "https://g/d?var-job={job}"}}})
    annotation = "checksum/config"
    assert (collector["spec"]["template"]["metadata"]["annotations"][annotation]
            != _collector(other)["spec"]["template"]["metadata"]["annotations"][annotation])
    for obj in (collector, config_map):
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert pod_spec(collector)["automountServiceAccountToken"] is False


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "unknown kind": ({"receivers": [{"name": "x", "kind": "email", "url": "http://x"}]},
                     "/lens/alertDelivery/receivers/0/kind"),
    "unknown key": ({"receivers": [{"name": "x", "kind": "alertmanager", "url": "http://x",
                                    "timeout": 3}]}, "additional properties 'timeout'"),
    "inline secret": ({"receivers": [{"name": "x", "kind": "webhook", "url": "http://x",
                                      "secret": "hunter2"}]},
                      "/lens/alertDelivery/receivers/0/secret"),
    "zero attempts": ({"receivers": [{"name": "x", "kind": "alertmanager", "url": "http://x",
                                      "max_attempts": 0}]},
                      "/lens/alertDelivery/receivers/0/max_attempts"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_receivers_are_refused_by_helm_and_by_the_model(
        helm: Path, values_dir: Path, case: str) -> None:
    delivery, message = BAD[case]
    file = values_dir / f"bad-delivery-{case.replace(' ', '-')}.yaml"
    file.write_text(yaml.safe_dump({"lens": {"alertDelivery": delivery}}))
    proc = run_helm(helm, "template", RELEASE, CHART, "--values", file)
    assert proc.returncode != 0, f"{case}: accepted"
    assert message in proc.stderr, proc.stderr
    with pytest.raises(ValidationError):
        DeliveryConfig.model_validate(delivery)


def test_a_secret_file_of_an_unmounted_secret_is_refused(helm: Path, values_dir: Path,
                                                         tmp_path: Path) -> None:
    file = values_dir / "delivery-unmounted-secret.yaml"
    file.write_text(yaml.safe_dump({"lens": {"alertDelivery": DELIVERY}}))
    proc = run_helm(helm, "template", RELEASE, CHART, "--values", file)
    assert proc.returncode != 0
    assert "pager-hmac" in proc.stderr and "alertDeliverySecrets" in proc.stderr, proc.stderr
    example = tmp_path / "example.yaml"  # the commented example in values.yaml is valid
    text = (CHART / "values.yaml").read_text()
    block = text[text.index("  # alertDelivery:\n"):text.index("  alertDelivery: {}")]
    example.write_text("\n".join(line[4:] for line in block.splitlines()[1:]))
    assert load_model(example, DeliveryConfig).receivers[1].name == "pager"
