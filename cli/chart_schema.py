"""The parts of the Helm chart's values.schema.json that come from the
services' configuration models.

Each configuration file a service loads (the scheduler's workspaces and
priorities, failover's fault rules, Lens alert rules, the bench config) is a
pydantic model. The chart renders those files from values
(``scheduler.config``, ``failover.rules``, ``lensCollector.alertRules``,
``lens.alertDelivery``, ``bench.config``), and ``helm install`` must refuse what the service would
refuse. So the schema of each of those values is the model's own JSON schema,
never written by hand: ``python -m cli.catalog --write`` puts it into
``definitions`` (the model's root as ``definitions.<name>``, its nested models
as ``definitions.<name>.<Model>``) and ``--check`` fails when it drifted.

Only those definitions are rewritten; every other part of the schema file is
kept as it is (it is written by hand). Pure: ``chart_schema`` takes the
current schema and returns the new one.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from services.bench.config import BenchConfig
from services.failover.faults import FailoverRules
from services.lens_collector.alerts import AlertConfig
from services.lens_collector.delivery_config import DeliveryConfig
from services.scheduler.config import SchedulerFile

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "deploy" / "helm" / "primus-safe" / "values.schema.json"

# definitions name -> the model a service loads from the rendered file.
MODELS: dict[str, type[BaseModel]] = {
    "schedulerConfig": SchedulerFile,
    "failoverRules": FailoverRules,
    "alertRules": AlertConfig,
    "alertDelivery": DeliveryConfig,
    "benchConfig": BenchConfig,
}
MARK = "x-model"  # names the model a definition was generated from


def _model_path(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _clean(node: Any, name: str) -> Any:
    """A schema node without titles, its refs pointing at definitions.<name>.<Model>."""
    if isinstance(node, list):
        return [_clean(item, name) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
            out[key] = f"#/definitions/{name}.{value.removeprefix('#/$defs/')}"
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            # A mapping of names to schemas: a field may be called "title".
            out[key] = {k: _clean(v, name) for k, v in value.items()}
        elif key in ("default", "examples", "const", "enum"):
            out[key] = value  # data, not schema
        else:
            out[key] = _clean(value, name)
    return out


def model_definitions(name: str, model: type[BaseModel]) -> dict[str, Any]:
    """The definitions one model contributes: its root and its nested models. Pure."""
    raw = model.model_json_schema(mode="validation")
    nested = raw.pop("$defs", {})
    root = _clean(raw, name)
    root[MARK] = _model_path(model)
    root.setdefault("description", f"Loaded by {_model_path(model)}.")
    defs = {name: root}
    for sub, schema in sorted(nested.items()):
        defs[f"{name}.{sub}"] = _clean(schema, name)
    return defs


def owned(definition: str, models: dict[str, type[BaseModel]] = MODELS) -> bool:
    """Whether a definition is generated here (and so may be replaced or removed)."""
    return any(definition == n or definition.startswith(f"{n}.") for n in models)


def chart_schema(schema: dict[str, Any],
                 models: dict[str, type[BaseModel]] = MODELS) -> dict[str, Any]:
    """The values schema with the models' definitions replaced. Pure."""
    result = copy.deepcopy(schema)
    definitions = {k: v for k, v in result.get("definitions", {}).items() if not owned(k, models)}
    for name, model in models.items():
        definitions.update(model_definitions(name, model))
    result["definitions"] = definitions
    return result


def render(text: str) -> str:
    """The schema file's new text from its current text (same formatting)."""
    return json.dumps(chart_schema(json.loads(text)), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # only this file; `python -m cli.catalog --write` writes them all
    SCHEMA_FILE.write_text(render(SCHEMA_FILE.read_text()))
