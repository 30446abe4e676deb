"""Values scenarios the chart must render, lint and validate under, shared by
the deployment tests. Together they switch every optional part on and off:
bundled and external NATS/ClickHouse, a NATS cluster, users and token auth,
NetworkPolicies and PodDisruptionBudgets, a privileged and an unprivileged
agent."""

from __future__ import annotations

from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-services": {
        "nats": {"enabled": False, "url": "nats://nats.messaging.svc:4222"},
        "clickhouse": {
            "enabled": False,
            "external": {
                "url": "https://clickhouse.example.org:8443",
                "dsnSecret": {"name": "clickhouse-writer", "key": "dsn"},
                "readonlyUser": "grafana_ro",
                "readonlyPasswordSecret": {"name": "clickhouse-grafana", "key": "password"},
            },
        },
        "priorityClasses": {"create": False},
        "settings": {"heartbeat_missed": 5, "telemetry_interval_s": 2},
        "bootstrap": {"existingHostsConfigMap": "site-hosts"},
        "lensCollector": {"replicas": 4},
        "benchAgent": {"privileged": False, "gpuRequest": 1, "hostNetwork": True},
    },
    "existing-secret": {
        "auth": {"existingSecret": "primus-credentials"},
        "bootstrap": {
            "hosts": {
                "cluster": "prod-a",
                "nodes": [
                    {
                        "name": "gpu-001",
                        "ip": "10.0.0.11",
                        "labels": {"rack": "r1"},
                        "gpu_model": "MI300X",
                        "gpu_count": 8,
                    },
                    {
                        "name": "gpu-002",
                        "ip": "10.0.0.12",
                        "labels": {"rack": "r1"},
                        "gpu_model": "MI300X",
                        "gpu_count": 8,
                    },
                ],
            }
        },  # fmt: skip
        "grafana": {"datasource": {"enabled": False}, "dashboards": {"enabled": False}},
        "lensCollector": {"replicas": 1},
        "networkPolicy": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
    },
    "nats-cluster": {
        "nats": {"cluster": {"enabled": True, "replicas": 3}},
        "networkPolicy": {
            "nats": {"extraFrom": [{"ipBlock": {"cidr": "10.0.0.0/16"}}]},
            "grafana": {"from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}]},
        },
        "benchAgent": {"hostNetwork": True},
        "failover": {"replicas": 1},
        # A setting passed through extraEnv is held to the settings contract too.
        "lensCollector": {"extraEnv": [{"name": "PRIMUS_LOG_SHIP", "value": "true"}]},
    },
}
