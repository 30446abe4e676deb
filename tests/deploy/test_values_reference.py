"""The README's values reference is generated from values.schema.json, and
every schema property says what it is for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from deploy_helpers import CHART, REPO

sys.path.insert(0, str(REPO / "deploy" / "helm"))
import values_reference  # noqa: E402  (a script beside the chart, not a package)

SCRIPT = REPO / "deploy" / "helm" / "values_reference.py"


def load() -> tuple[dict, dict]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    return schema, yaml.safe_load((CHART / "values.yaml").read_text())


def test_readme_values_reference_is_current() -> None:
    proc = subprocess.run([sys.executable, SCRIPT, "--check"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_schema_property_has_a_description() -> None:
    schema, values = load()
    keys = [row[0] for row in values_reference.rows(schema, values)]  # raises on a missing one
    assert len(keys) == len(set(keys))
    # Definitions are expanded where they are used: one row per service's replicas.
    for service in ("scheduler", "lensCollector", "failover", "benchCoordinator"):
        assert f"{service}.replicas" in keys


def test_every_value_has_a_row() -> None:
    schema, values = load()
    keys = {row[0] for row in values_reference.rows(schema, values)}

    def leaves(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict) and node and prefix not in FREE_FORM:
            return [k for name, v in node.items() for k in leaves(v, f"{prefix}{name}.")]
        return [prefix.rstrip(".")]

    FREE_FORM = {"settings.", "bootstrap.hosts."} | {
        f"{p}{name}." for p in ("", "nats.", "clickhouse.", "bootstrap.", "scheduler.",
                                "lensCollector.", "failover.", "benchCoordinator.",
                                "benchAgent.")
        for name in ("resources", "nodeSelector", "affinity", "podAnnotations")
    } | {"podSecurityContext.", "securityContext.", "grafana.datasource.labels.",
         "grafana.dashboards.labels.", "nats.resources.", "clickhouse.resources."} | {
        f"{key}." for key in MODEL_KEYS}  # a service's file: its model documents the fields
    missing = [k for k in leaves(values, "") if k not in keys]
    assert not missing, missing


# Values whose schema is a service's configuration model (cli/chart_schema.py).
MODEL_KEYS = ("scheduler.config", "failover.rules", "lensCollector.alertRules", "bench.config")


def test_a_model_backed_value_is_one_row() -> None:
    schema, values = load()
    rows = {row[0]: row for row in values_reference.rows(schema, values)}
    for key in MODEL_KEYS:
        assert key in rows
        assert not [k for k in rows if k.startswith(f"{key}.")], key
    assert rows["bench.config"][2] == "see values.yaml"  # the default probes
    assert rows["scheduler.config"][2] == "`{}`"


def test_a_property_without_description_is_named() -> None:
    schema = {"properties": {"nats": {"type": "object", "description": "the bus",
                                      "properties": {"url": {"type": "string"}}}}}
    with pytest.raises(values_reference.SchemaError, match="property nats.url has no description"):
        list(values_reference.rows(schema, {}))


def test_the_table_escapes_markdown(tmp_path: Path) -> None:
    schema = {"properties": {"a": {"type": ["string", "integer"], "description": "x | <y>"}}}
    text = values_reference.table(schema, {"a": "v"})
    assert '| `a` | string \\| integer | `"v"` | x \\| &lt;y&gt; |' in text
    readme = "intro\n" + values_reference.START + "\nold\n" + values_reference.END + "\nrest\n"
    out = values_reference.render(readme, schema, {"a": "v"})
    assert out.startswith("intro\n") and out.endswith("rest\n") and "old" not in out
