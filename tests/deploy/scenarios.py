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
        "lensCollector": {
            "replicas": 4,
            "alertRules": {
                "gpu_temp_c": {"above": 85, "for_s": 300, "clear_below": 80, "clear_for_s": 60,
                               "severity": "critical"},
                "job_hang_s": 900,
                "throughput_ratio": 0.7,
            },
        },
        "benchAgent": {"privileged": False, "gpuRequest": 1, "hostNetwork": True,
                       # read positions in the pod's scratch directory, not on the node
                       "podLogs": {"positionsHostPath": ""}},
        # Every service's configuration file with values other than the defaults
        # (tests/deploy/test_chart_config.py loads each with the service's loader).
        "scheduler": {"config": {
            "priorities": {"low": 10, "medium": 20, "high": 30},
            "preemption_grace_s": 45,
            "degraded_nodes": "never",
            "workspaces": [
                {"name": "research", "quota_gpus": 64, "node_pools": ["mi300x"],
                 "queue_policy": "balance"},
                {"name": "prod", "quota_by_model": {"MI300X": 128}, "preemption": False},
            ],
            "pools": [{"name": "mi300x", "gpus_by_model": {"MI300X": 256}}],
        }},
        "failover": {"rules": {
            "rules": [
                {"kind": "heartbeat_missed", "consecutive": 2},
                {"kind": "alert:job_hang", "scope": "job", "failover": False},
            ],
            "infra_exit_codes": [-7, 135],
        }},
        "bench": {"config": {
            "probes": [{"name": "gpu-power", "kind": "gpu_power", "interval_s": 120,
                        "timeout_s": 15, "failures_before_report": 2}],
            "gpu_limits": {"max_temp_c": 90, "min_pcie_width": 16},
            "standard": {"gpu_membw_bytes": 4294967296},
            "fleet": {"min_peers": 5},
            "floors": {"MI300X": {"gemm_bf16_8192_tflops": 500.5}},
        }},
        # An existing claim: the chart creates none and the workers mount it.
        "checkpoints": {"create": False, "claimName": "training-checkpoints"},
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
        # The chart's claim under a name and StorageClass of the operator's.
        "checkpoints": {"create": True, "claimName": "ckpt", "storageClassName": "cephfs",
                        "size": "10Ti"},
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
        # No shared checkpoint volume at all.
        "checkpoints": {"create": False},
        # A setting passed through extraEnv is held to the settings contract too.
        "lensCollector": {"extraEnv": [{"name": "PRIMUS_LOG_SHIP", "value": "true"}]},
    },
}
