"""One settings model for every service, so the same code runs embedded, in
compose and in Kubernetes: values come from ``PRIMUS_*`` environment variables
or from a YAML file named by ``PRIMUS_SETTINGS_FILE`` (environment wins)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

if TYPE_CHECKING:
    from libs.log_shipper import LogLimits


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PRIMUS_", extra="forbid")

    nats_url: str = "nats://127.0.0.1:4222"
    nats_token: str | None = Field(default=None, description="NATS auth token (a secret)")
    nats_user: str | None = Field(
        default=None, description="NATS user (one per service, libs/nats_permissions.py)")
    nats_password: str | None = Field(
        default=None, description="the NATS user's password (a secret)")
    nats_tls_ca: Path | None = Field(
        default=None, description="CA bundle that signed the NATS server's certificate")
    nats_tls_cert: Path | None = Field(
        default=None, description="client certificate for NATS (mutual TLS)")
    nats_tls_key: Path | None = Field(
        default=None, description="the client certificate's private key")
    job_credential_key: SecretStr | None = Field(
        default=None, description="scheduler: the cluster key each job's NATS credential is "
        "an HMAC under (libs/job_credentials.py); the drivers hand a job's workers theirs and "
        "the auth callout checks it (a secret)")
    nats_callout_seed: SecretStr | None = Field(
        default=None, description="scheduler: the NATS auth callout's account nkey seed (SA...) "
        "or a secret string one is derived from; nats-server's auth_callout issuer is its "
        "public key (a secret). Unset: the scheduler answers no callout")
    job_credential_ttl_s: int = Field(
        default=300, ge=2, le=86400, description="scheduler: how long a job's NATS login lasts "
        "before the server checks the job again; a job that ended loses its connections "
        "within this bound")
    nats_replicas: int = Field(
        default=1, ge=1, le=5,
        description="copies of every stream and KV bucket (3 on a 3-server NATS cluster)")
    clickhouse_dsn: str = Field(
        default="",
        description="chdb:///abs/path for the in-process engine or http(s)://user:pw@host:8123; "
        "empty means chdb under state_dir",
    )
    clickhouse_database: str = "primus"
    clickhouse_cluster: str | None = Field(
        default=None, description="lens-collector: the ClickHouse cluster (its remote_servers "
        "name) to create the schema on: replicated tables on every shard and a Distributed "
        "table over them under each table's own name (libs/clickhouse_cluster.py). Unset: one "
        "server")
    state_dir: Path = Path(".primus")
    cli_bus_wait_s: float | None = Field(
        default=None, ge=0, le=3600, description="operator verbs: how long to wait for a bus "
        "that does not answer before giving up. Unset: 30 s when a running `primus-safe up` "
        "owns the bus (its nats-server is restarting), else none (say so at once)")
    node_name: str | None = Field(default=None, description="the node a bench agent runs on")
    instance: str | None = Field(
        default=None, description="this replica's name: it answers its own health check on "
        "safe.health.<service>.<instance>. Default: the host name (the pod name); set it "
        "when replicas share a machine")
    metrics: bool = Field(default=True, description="serve Prometheus metrics on /metrics "
                          "(every service; the bench agent adds its node's GPUs and host)")
    metrics_host: str = Field(default="0.0.0.0", description="address /metrics listens on")
    metrics_port: int = Field(
        default=9470, ge=0, le=65535, description="port of this process's /metrics (0: any "
        "free port, said in the log and the health reply)")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    heartbeat_missed: int = Field(default=3, ge=1, description="missed beats that open a fault")
    agent_restart_grace_s: float = Field(
        default=120.0, ge=0, le=3600, description="bench agent: how soon it says it will beat "
        "again when it stops cleanly (SIGTERM); failover waits that long before a fault")
    rebench_first_s: float = Field(
        default=60.0, gt=0, description="bootstrap: a quarantined node is benched again this "
        "long after it left service, then after twice as long, up to rebench_max_interval_s")
    onboarding_bench_level: Literal["quick", "standard", "full"] = Field(
        default="standard", description="bootstrap: the bench a new or quarantined node must "
        "pass before it takes jobs (standard: GEMM, HBM, a training step, judged against the "
        "fleet and the GPU model's peak floors); quick only checks devices and tools")
    bench_verdict_wait_s: float = Field(
        default=300.0, ge=0, description="bootstrap: how long a node whose standard/full bench "
        "passed on its agent waits in preflight for bench-coordinator's fleet verdict before "
        "the agent's own result stands (0: do not wait)")
    rebench_max_interval_s: float = Field(default=3600.0, gt=0)
    rebench_attempts: int = Field(
        default=10, ge=0, description="re-benches of a quarantined node before it waits for an "
        "operator (0: never re-bench by itself)")
    heartbeat_first_grace_s: float = Field(
        default=30.0, ge=0, description="how long a registered node's agent may take to send "
        "its first heartbeat (starting on a busy machine) before failover opens a fault")
    clock_skew_s: float = Field(
        default=30.0, gt=0, description="an event stamped further than this from when it was "
        "received is flagged, and its stamp is not used to order or time anything")
    telemetry_interval_s: float = Field(default=1.0, gt=0)
    k8s_namespace: str = "default"
    k8s_image: str | None = Field(default=None, description="training image (kubernetes driver)")
    k8s_gpu_resource: str = "amd.com/gpu"
    k8s_checkpoint_pvc: str | None = None
    k8s_service_account: str | None = None
    k8s_master_port: int = 29500
    k8s_nats_token_secret: str | None = None
    k8s_cluster_domain: str = Field(
        default="cluster.local", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
        r"[a-z0-9])?)*$", description="the cluster's DNS domain, as the hosts file's "
        "kubernetes.dns_domain (Kubespray's dns_domain): pod addresses end in it")
    log_ship: bool = Field(default=False, description="also send log lines over the bus to Lens")
    worker_log_ship: bool = Field(default=True, description="send workers' stdout and stderr "
                                  "to Lens (the logs table)")
    worker_log_rate_bytes_s: int = Field(
        default=8 << 20, gt=0, description="a job's output Lens takes per second, shared by "
        "its workers; more is dropped and counted, never blocking the job")
    worker_log_min_rate_bytes_s: int = Field(default=256 << 10, gt=0,
                                             description="per worker, however large the job")
    worker_log_max_line_bytes: int = Field(default=16384, ge=256,
                                           description="longer lines are cut, with a marker")
    worker_log_file_max_bytes: int = Field(
        default=100 << 20, ge=4096, description="local driver: a rank's log file is rotated "
        "at this size")
    worker_log_file_keep: int = Field(default=3, ge=0,
                                      description="local driver: rotated log files kept")
    agent_pod_logs_dir: Path | None = Field(
        default=None, description="bench agent on Kubernetes: the kubelet's pod log directory "
        "(/var/log/pods), whose worker containers' output the agent ships to Lens; unset: "
        "off (the local driver's supervisors ship it themselves)")
    bench_health_catalogue: bool = Field(
        default=True, description="bench agent: run the node-health catalogue's probes "
        "(services/bench/health) besides the configured ones; the embedded stack turns it "
        "off (its local nodes share one host, whose kernel log and settings are not theirs)")
    agent_checkpoints_dir: Path | None = Field(
        default=None, description="bench agent on Kubernetes: the shared checkpoint claim, "
        "mounted read-only; the agent of the node running a job's rank 0 watches the job's "
        "directory (jobs/<job>) and announces its newest complete checkpoint; unset: off")
    agent_exporter_names: Literal["auto", "amd", "nvidia"] = Field(
        default="auto", description="bench agent's /metrics: GPU series under AMD "
        "device-metrics-exporter names (amd), dcgm-exporter names (nvidia), or by the tool "
        "that answered (auto: nvidia-smi gives dcgm-exporter's, the others AMD's)")
    lens_logs_ttl_days: int = Field(default=14, ge=1, description="lens-collector: how long "
                                    "log lines (workers' and services') are kept")
    lens_alerts_file: Path | None = Field(default=None, description="lens-collector: alert rules")
    lens_alert_receivers: Path | None = Field(
        default=None, description="lens-collector: where alerts are delivered (Alertmanager, "
        "webhooks) and which alerts go where (YAML); unset: alerts are only stored")
    lens_log_alerts_file: Path | None = Field(
        default=None, description="lens-collector: log alert rules added to (or replacing, by "
        "name) the built-in ones")
    bench_config: Path | None = Field(
        default=None, description="bench agent and coordinator: levels, probes, fleet policy "
        "(YAML, re-read when it changes)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    driver: Literal["local", "kubernetes"] = Field(
        default="local", description="where workers run: local processes or Kubernetes pods")
    hosts_file: Path | None = Field(default=None, description="bootstrap: the hosts.yaml")
    failover_rules: Path | None = Field(
        default=None, description="failover: fault rules and infrastructure exit codes (YAML)")
    scheduler_config: Path | None = Field(
        default=None, description="scheduler: workspaces, priorities, preemption (YAML)")
    leader_ttl_s: int = Field(
        default=15, ge=2,
        description="scheduler, bench-coordinator: seconds a leader's lease lives without "
        "renewal (whole seconds, as NATS keeps message TTLs); a standby takes over within it")
    leader_id: str | None = Field(
        default=None,
        description="scheduler, bench-coordinator: this replica's name in the leader lease; "
        "unique per live replica, stable across its restarts (default: host name plus "
        "state_dir; the chart uses the pod name)")
    settings_file: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("PRIMUS_SETTINGS_FILE")
        if path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

    @property
    def worker_log_limits(self) -> LogLimits:
        from libs.log_shipper import LogLimits  # the events module, only when asked

        return LogLimits(ship=self.worker_log_ship, rate_bytes_s=self.worker_log_rate_bytes_s,
                         min_rate_bytes_s=self.worker_log_min_rate_bytes_s,
                         max_line_bytes=self.worker_log_max_line_bytes,
                         file_max_bytes=self.worker_log_file_max_bytes,
                         file_keep=self.worker_log_file_keep)

    @property
    def nats_auth(self) -> dict[str, Any]:
        """Bus.connect's credentials besides the token: user, password, TLS files."""
        return {"user": self.nats_user, "password": self.nats_password,
                "tls_ca": self.nats_tls_ca, "tls_cert": self.nats_tls_cert,
                "tls_key": self.nats_tls_key}

    @property
    def store_dsn(self) -> str:
        if self.clickhouse_dsn:
            return self.clickhouse_dsn
        return f"chdb://{(self.state_dir / 'clickhouse').resolve()}"
