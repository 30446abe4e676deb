"""docker-compose.yml: valid against the Compose Specification, and wired right.

The schema is a copy of compose-spec.json from the compose-spec project (see
README.md beside this file for its source); no Docker daemon is needed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_helpers import ALL_VERBS, DEPLOYMENT_VERBS, PRIMUS_ENV, REPO, interpolate, parse_cli

COMPOSE_FILE = REPO / "docker-compose.yml"
SCHEMA_FILE = Path(__file__).with_name("compose-spec.json")
AGENTS = {"bench-agent-1": "node-1", "bench-agent-2": "node-2"}
# The inventory (libs/inventory.py HostsFile) validates hosts.yaml when present.


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # Anchors and merge keys resolve here as they do in Compose.
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# The schema declares draft-07 as "https://json-schema.org/draft-07/schema",
# a spelling jsonschema does not map to a draft by itself.
Validator = jsonschema.Draft7Validator


def test_schema_copy_is_a_valid_schema() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    assert "draft-07" in schema["$schema"]
    Validator.check_schema(schema)
    assert schema["title"] == "Compose Specification"


def test_compose_file_matches_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = Validator(schema)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)


def test_the_whole_stack_is_there(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"nats", "nats-callout-issuer", "clickhouse", "grafana",
                             *DEPLOYMENT_VERBS, *AGENTS}


def test_nats_runs_jetstream(services: dict[str, dict[str, Any]]) -> None:
    nats = services["nats"]
    assert nats["image"].startswith("nats:")
    assert nats["command"] == ["--config", "/etc/nats/nats.conf"]
    assert "jetstream" in compose_nats_conf(nats_compose())
    assert "js-enabled-only" in " ".join(nats["healthcheck"]["test"])


def test_clickhouse_is_the_official_server(services: dict[str, dict[str, Any]]) -> None:
    clickhouse = services["clickhouse"]
    assert clickhouse["image"].startswith("clickhouse/clickhouse-server:")
    env = clickhouse["environment"]
    assert env["CLICKHOUSE_DB"] == "primus" and env["CLICKHOUSE_USER"] == "primus"


def test_grafana_provisions_clickhouse_and_the_dashboards(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    grafana = services["grafana"]
    assert grafana["image"].startswith("grafana/grafana:")
    assert "grafana-clickhouse-datasource" in grafana["environment"]["GF_PLUGINS_PREINSTALL_SYNC"]
    targets = {c["source"]: c["target"] for c in grafana["configs"]}
    assert targets["grafana-datasource"].startswith("/etc/grafana/provisioning/datasources/")
    assert targets["grafana-dashboards"].startswith("/etc/grafana/provisioning/dashboards/")

    (datasource,) = yaml.safe_load(compose["configs"]["grafana-datasource"]["content"])[
        "datasources"
    ]
    assert datasource["type"] == "grafana-clickhouse-datasource"
    assert datasource["jsonData"]["host"] == "clickhouse"
    assert datasource["jsonData"]["defaultDatabase"] == "primus"
    # `$$` in Compose leaves `$` for Grafana to expand from its environment.
    assert datasource["secureJsonData"]["password"] == "$${CLICKHOUSE_READONLY_PASSWORD}"
    assert "CLICKHOUSE_READONLY_PASSWORD" in grafana["environment"]
    assert "CLICKHOUSE_PASSWORD" not in grafana["environment"]  # not the writer's

    # Grafana's user is read-only: ClickHouse's readonly profile and SELECT
    # on the primus database, its password from the server's environment.
    assert datasource["jsonData"]["username"] == "grafana"
    clickhouse = services["clickhouse"]
    (mounted,) = clickhouse["configs"]
    assert mounted["source"] == "clickhouse-readonly-user"
    assert mounted["target"].startswith("/etc/clickhouse-server/users.d/")
    users = ET.fromstring(compose["configs"]["clickhouse-readonly-user"]["content"])
    reader = users.find("users/grafana")
    assert reader.find("profile").text == "readonly"
    assert users.find("profiles/readonly/readonly").text == "1"
    assert [q.text for q in reader.findall("grants/query")] == ["GRANT SELECT ON primus.*"]
    password_var = reader.find("password").get("from_env")
    assert password_var in clickhouse["environment"]
    assert clickhouse["environment"]["CLICKHOUSE_USER"] == "primus"  # the writer

    (provider,) = yaml.safe_load(compose["configs"]["grafana-dashboards"]["content"])["providers"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("./"))
    assert mounts["./deploy/helm/primus-safe/dashboards"] == provider["options"]["path"]
    assert (REPO / "deploy/helm/primus-safe/dashboards").is_dir()


def primus_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if name in (*DEPLOYMENT_VERBS, *AGENTS)}


def test_services_run_from_one_image_with_their_verb(services: dict[str, dict[str, Any]]) -> None:
    for verb in DEPLOYMENT_VERBS:
        service = services[verb]
        assert service["image"] == "primus-safe:dev"
        assert service["build"] == {"context": ".", "target": "runtime"}
        assert service["command"] == [verb]
    for name in AGENTS:
        assert services[name]["image"] == "primus-safe-agent:dev"
        assert services[name]["build"] == {"context": ".", "target": "agent"}
        assert services[name]["command"] == ["bench-agent"]


def test_every_command_exists_in_the_cli(services: dict[str, dict[str, Any]]) -> None:
    """Each container's command (after the image's `primus-safe` entrypoint)
    and each `primus-safe` health check parse with the real CLI parser."""
    checked = 0
    for name, service in primus_services(services).items():
        args = parse_cli(service["command"])
        assert args.verb in ALL_VERBS, name
        test = service["healthcheck"]["test"]
        assert test[:2] == ["CMD", "primus-safe"], name
        parse_cli(test[2:])
        checked += 1
    assert checked == len(DEPLOYMENT_VERBS) + len(AGENTS)
    with pytest.raises(AssertionError, match="refused by the CLI"):
        parse_cli(["lens-colector"])
    with pytest.raises(AssertionError, match="no such service"):
        parse_cli(["health", "grafana"])


def test_env_is_the_primus_contract(services: dict[str, dict[str, Any]]) -> None:
    for name, service in primus_services(services).items():
        env = service["environment"]
        assert set(env) <= PRIMUS_ENV, f"{name}: {set(env) - PRIMUS_ENV}"
        assert env["PRIMUS_NATS_URL"] == "nats://nats:4222"
        assert env["PRIMUS_CLICKHOUSE_DSN"].startswith("http://primus:")
        assert env["PRIMUS_CLICKHOUSE_DSN"].endswith("@clickhouse:8123")
        assert env["PRIMUS_DRIVER"] == "local"


def test_agents_are_the_nodes(services: dict[str, dict[str, Any]]) -> None:
    for name, node in AGENTS.items():
        agent = services[name]
        assert agent["environment"]["PRIMUS_NODE_NAME"] == node
        assert node in agent["networks"]["default"]["aliases"]
        assert agent["healthcheck"]["test"] == [
            "CMD", "primus-safe", "health", "bench-agent", "--node", node,
        ]  # fmt: skip


def nats_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_nats_conf(compose: dict[str, Any]) -> str:
    return interpolate(compose["configs"]["nats-conf"]["content"])


def test_the_code_accepts_the_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = pytest.importorskip("libs.settings")
    for name, service in primus_services(services).items():
        for var in [n for n in os.environ if n.startswith("PRIMUS_")]:
            monkeypatch.delenv(var)
        for var, value in service["environment"].items():
            monkeypatch.setenv(var, interpolate(value))
        parsed = settings.Settings()
        assert parsed.nats_token is None, name  # no shared token: the platform login
        assert (parsed.nats_user, parsed.nats_password) == ("platform", "primus-dev-password")
        if name == "scheduler":  # it mints job credentials and answers the callout
            assert parsed.job_credential_key is not None
            assert parsed.nats_callout_seed is not None
        assert parsed.clickhouse_dsn == "http://primus:primus-dev-password@clickhouse:8123", name
        assert parsed.log_ship is True, name  # its own lines into Lens, as the platform user


def test_health_checks_ask_each_service(services: dict[str, dict[str, Any]]) -> None:
    for verb in DEPLOYMENT_VERBS:
        assert services[verb]["healthcheck"]["test"] == ["CMD", "primus-safe", "health", verb]
    for name in ("nats", "clickhouse", "grafana"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert {*DEPLOYMENT_VERBS, "bench-agent"} == set(ALL_VERBS)


def test_services_are_locked_down(services: dict[str, dict[str, Any]]) -> None:
    for name, service in primus_services(services).items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "/var/lib/primus-safe" in service["tmpfs"], name


def test_bootstrap_reads_the_hosts_config(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    bootstrap = services["bootstrap"]
    (mount,) = bootstrap["configs"]
    assert mount["target"] == bootstrap["environment"]["PRIMUS_HOSTS_FILE"]
    hosts = yaml.safe_load(compose["configs"][mount["source"]]["content"])
    assert [n["name"] for n in hosts["nodes"]] == list(AGENTS.values())
    # Each node's address is the one its agent container gets.
    addresses = {
        node: services[name]["networks"]["default"]["ipv4_address"] for name, node in AGENTS.items()
    }
    assert {n["name"]: n["ip"] for n in hosts["nodes"]} == addresses
    subnet = ipaddress.ip_network(compose["networks"]["default"]["ipam"]["config"][0]["subnet"])
    assert all(ipaddress.ip_address(ip) in subnet for ip in addresses.values())


def test_hosts_config_is_a_valid_inventory(compose: dict[str, Any]) -> None:
    inventory = pytest.importorskip("libs.inventory")
    text = compose["configs"]["hosts"]["content"]
    hosts = inventory.HostsFile.model_validate(yaml.safe_load(text))
    assert [n.name for n in hosts.nodes] == list(AGENTS.values())


def test_references_resolve(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for config in service.get("configs", []):
            assert config["source"] in compose["configs"], (name, config)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith(("./", "/")):
                assert source in compose["volumes"], (name, source)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
