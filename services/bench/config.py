"""The bench service's own configuration file: periodic health probes, the
standard level's sizes and timing, the fleet-judgement policy and absolute
floors per GPU model.

It is a separate YAML file (``PRIMUS_BENCH_CONFIG``, ``Settings.bench_config``,
or a constructor argument) rather than part of the shared settings because
operators tune it
per fleet and change it while agents run: ``ConfigFile`` re-reads it when its
modification time changes, and a file that does not validate is refused with
its line and field while the last good configuration stays in force.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from libs.specs import SpecError, load_model
from services.bench.gpu_peaks import DEFAULT_FLOORS, GemmDtype, lookup, peak_floors
from services.bench.health import CATALOGUE

PeakDtype = Literal[GemmDtype, "hbm"]
# The GPU tool's readings and a small GEMM (probes.py), and the node-health
# catalogue (services/bench/health).
BUILTIN_KINDS: tuple[str, ...] = ("gpu_count", "gpu_temperature", "gpu_ecc", "gpu_pcie",
                                  "gpu_xgmi", "gpu_power", "gpu_vram", "gemm")
CheckKind = Literal[BUILTIN_KINDS + tuple(sorted(CATALOGUE))]  # type: ignore[valid-type]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CheckConfig(_Model):
    """One periodic health probe. A catalogue probe's interval, failures
    before a report, action and options default to its catalogue entry."""

    name: str = Field(min_length=1)
    kind: CheckKind
    interval_s: float = Field(default=60.0, gt=0)
    timeout_s: float = Field(default=30.0, gt=0)
    jitter_s: float = Field(default=0.0, ge=0, description="first run within [0, jitter) of start")
    skip_if_running: bool = True
    failures_before_report: int = Field(default=3, ge=1, description="consecutive failures")
    action: Literal["quarantine", "report"] = Field(
        default="quarantine", description="after the failing streak: quarantine (a failed "
        "bench result; failover's probe_failed, or its probe:<fault kind> rule) or report "
        "(logged and counted in primus_bench_probe_reports_total)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="a catalogue probe's options (expected counts, "
        "paths, thresholds); unknown names are refused")

    @model_validator(mode="before")
    @classmethod
    def _catalogue_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") in CATALOGUE:
            entry = CATALOGUE[data["kind"]]
            data = {"interval_s": entry.interval_s, "failures_before_report": entry.consecutive,
                    "action": entry.action, **data,
                    "options": {**entry.options, **(data.get("options") or {})}}
        return data

    @model_validator(mode="after")
    def _known_options(self) -> CheckConfig:
        known = set(CATALOGUE[self.kind].options) if self.kind in CATALOGUE else set()
        unknown = sorted(set(self.options) - known)
        if unknown:
            raise ValueError(f"probe {self.name} ({self.kind}) has no option "
                             f"{', '.join(unknown)}; its options: "
                             f"{', '.join(sorted(known)) or 'none'}")
        return self

    @property
    def fault_kind(self) -> str | None:
        return CATALOGUE[self.kind].fault if self.kind in CATALOGUE else None

    @property
    def severity(self) -> str:
        return CATALOGUE[self.kind].severity if self.kind in CATALOGUE else "critical"


class GpuLimits(_Model):
    """Thresholds of the GPU health checks; ``None`` switches a limit off."""

    max_temp_c: float | None = 95.0
    max_ecc_uncorrectable: int | None = 0
    max_xgmi_errors: int | None = 0
    min_pcie_width: int | None = None
    min_pcie_speed_gts: float | None = None
    max_power_over_cap: float | None = Field(default=1.10, description="power / power cap")
    max_vram_used_fraction: float | None = None


class Timing(_Model):
    """How each figure is timed: ``repeats`` samples of at least ``sample_s``
    each after ``warmup`` untimed calls; the figure is the median sample."""

    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=15, ge=1)
    sample_s: float = Field(default=0.08, gt=0)


class StandardConfig(_Model):
    gpu_gemm_sizes: list[int] = Field(default=[4096, 8192], min_length=1)
    gpu_gemm_dtypes: list[GemmDtype] = Field(
        default=list(get_args(GemmDtype)), min_length=1,
        description="int8 (torch._int_mm, int32 result, in TOPS) and fp8 (torch._scaled_mm, "
        "e4m3, bf16 result) run where the device supports them; elsewhere the result says "
        "why they were skipped")
    # bf16/fp16 matmul on a CPU is ~100x slower than fp32: only fp32 there.
    cpu_gemm_sizes: list[int] = Field(default=[256, 512], min_length=1)
    cpu_threads: int = Field(default=1, ge=1, description="torch threads per CPU device slot")
    gpu_membw_bytes: int = Field(default=1 << 30, gt=0)
    cpu_membw_bytes: int = Field(default=16 << 20, gt=0)
    gpu_collective_bytes: list[int] = Field(
        default=[64 << 20, 256 << 20, 1 << 30], min_length=1,
        description="intra-node message sizes: up to 1 GiB, where a link's bandwidth "
        "(not its latency) decides")
    min_link_fraction: float = Field(
        default=0.3, gt=0, le=1, description="GPU nodes: the largest message's intra-node "
        "busbw (worst of all-reduce, all-gather, all-to-all) below this share of what the "
        "best-connected GPU's XGMI, NVLink or PCIe links carry in one direction fails, naming "
        "any GPU whose links run below its peers. Lower than full.min_link_fraction: a PCIe "
        "ring that crosses the sockets reaches less of its links, and what this must catch "
        "is gross (a fabric fallen back to PCIe is under 15% of it)")
    cpu_collective_bytes: list[int] = Field(default=[1 << 20], min_length=1)
    cpu_collective_ranks: int = Field(default=2, ge=2)
    collective_timeout_s: float = Field(default=120.0, gt=0)
    train_steps: int = Field(default=24, ge=6)
    train_batch: int = Field(default=16, ge=1)
    train_seq: int = Field(default=32, ge=2)
    max_step_time_spread: float = Field(
        default=3.0, gt=1, description="p90/p50 of step times above this is unstable")
    max_gpu_shortfall: float = Field(
        default=0.25, gt=0, lt=1, description="a GPU this far below the median of its node's "
        "GPUs (GEMM, HBM or training rate) fails the node's gpu_balance check")
    timing: Timing = Timing()
    gpu_timing: Timing = Timing(warmup=3, repeats=7, sample_s=0.2)


class FleetPolicy(_Model):
    """When a node's figures are far enough below its GPU model's fleet."""

    min_peers: int = Field(default=3, ge=1, description="fewer peers: abstain")
    k: float = Field(default=3.0, gt=0, description="robust deviations below the median")
    figure_drop: float = Field(default=0.20, gt=0, lt=1,
                               description="one figure this far below the median is degraded")
    node_drop: float = Field(default=0.045, gt=0, lt=1,
                             description="the node's geometric-mean score this far below")
    node_k: float = Field(default=2.0, gt=0, description="robust deviations of the node score")
    retry_share: float = Field(
        default=0.5, gt=0, le=1,
        description="a repeat whose node score is within this share of node_drop is normal; "
                    "between that and node_drop it is unsure and the node is measured again")
    max_retries: int = Field(default=2, ge=1, le=5,
                             description="repeats of a suspect at most (unsure ones only)")
    min_figure_spread: float = Field(
        default=0.01, gt=0, description="floor of a figure's relative spread when weighting")
    fail_drop: float = Field(default=0.50, gt=0, lt=1,
                             description="a figure this far below the median is a failure")
    max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0, description="older peers are ignored")


class FullConfig(_Model):
    port_base: int = Field(default=29600, ge=1024, le=65000)
    port_span: int = Field(default=300, ge=1, le=500)
    rendezvous_timeout_s: float = Field(default=60.0, gt=0)
    internode_bytes: list[int] = Field(
        default=[1 << 20], min_length=1, description="between CPU-only nodes (gloo)")
    gpu_internode_bytes: list[int] = Field(
        default=[64 << 20, 1 << 30], min_length=1, description="between GPU nodes and in the "
        "split search: large messages, which a NIC at half its rate cannot hide")
    min_pair_fraction: float = Field(
        default=0.5, gt=0, le=1, description="pair busbw below this share of the fleet fails")
    min_link_fraction: float = Field(
        default=0.4, gt=0, le=1, description="GPU nodes: the largest message's inter-node "
        "busbw below this share of the node's fastest RDMA port rate fails, naming any port "
        "running below its peers")


class BenchConfig(_Model):
    probes: list[CheckConfig] = []
    health_catalogue: bool = Field(
        default=True, description="run every node-health catalogue probe "
        "(services/bench/health) at its default schedule, except those of a kind `probes` "
        "configures and those named in health_off")
    health_off: list[str] = Field(default_factory=list,
                                  description="catalogue probe kinds not to run")
    gpu_limits: GpuLimits = GpuLimits()
    standard: StandardConfig = StandardConfig()
    full: FullConfig = FullConfig()
    fleet: FleetPolicy = FleetPolicy()
    floors: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="GPU model -> figure name -> lowest acceptable value (in the figure's "
        "unit); stands over the floor derived from the model's peak")
    peak_floors: dict[PeakDtype, float] = Field(
        default_factory=lambda: dict(DEFAULT_FLOORS),
        description="dtype (bf16, fp16, fp32, int8, fp8) or hbm -> the share of the GPU "
        "model's published peak (services/bench/gpu_peaks.py) below which a GEMM of at least "
        "8192^3 (or the HBM copy/triad bandwidth) fails the node, whatever the fleet "
        "measures; {} turns them off")

    @field_validator("peak_floors")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not 0 < v <= 1}
        if bad:
            raise ValueError(f"a share of peak is above 0 and at most 1; got {bad}")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> BenchConfig:
        names = [c.name for c in self.probes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"probe names must be unique; repeated: {', '.join(dupes)}")
        return self

    @field_validator("health_off")
    @classmethod
    def _catalogue_kinds(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(CATALOGUE))
        if unknown:
            raise ValueError(f"no catalogue probe {', '.join(unknown)}; the catalogue: "
                             f"{', '.join(sorted(CATALOGUE)) or 'empty'}")
        return value

    def scheduled_probes(self, *, catalogue: bool = True) -> list[CheckConfig]:
        """The configured probes, then each catalogue probe not configured or
        switched off, at its defaults (``catalogue``: the agent's setting)."""
        out = list(self.probes)
        if not (catalogue and self.health_catalogue):
            return out
        configured = {c.kind for c in self.probes} | set(self.health_off)
        names = {c.name for c in self.probes}
        for kind in sorted(set(CATALOGUE) - configured):
            name = kind if kind not in names else f"health_{kind}"
            out.append(CheckConfig(name=name, kind=kind,  # type: ignore[arg-type]
                                   jitter_s=min(CATALOGUE[kind].interval_s, 30.0)))
        return out

    def floors_of(self, gpu_model: str, figures: list[str]) -> dict[str, float]:
        """Every floor for these figures of a run on ``gpu_model``: the share
        of the model's peak, overridden by the configured absolute floors."""
        derived = peak_floors(figures, lookup(gpu_model), dict(self.peak_floors))
        return {**derived, **self.floors_for(gpu_model)}

    def floors_for(self, gpu_model: str) -> dict[str, float]:
        """Floors of the first configured model named in ``gpu_model`` (case-insensitive),
        so 'MI300X' matches torch's 'AMD Instinct MI300X'."""
        wanted = gpu_model.lower()
        for model, floors in sorted(self.floors.items(), key=lambda kv: -len(kv[0])):
            if model.lower() == wanted or model.lower() in wanted:
                return floors
        return {}


class ConfigFile:
    """The configuration from a file, re-read when its modification time changes.

    ``current`` is always a valid configuration: the defaults without a file,
    else the last version of the file that validated."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self.current = BenchConfig()
        self.error: str | None = None
        self._mtime: float | None = None
        if self.path is not None:
            self.reload()

    def reload(self) -> bool:
        """Re-read the file if it changed; True when a new configuration took effect.
        Raises nothing: a bad or missing file sets ``error`` and keeps ``current``."""
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime
        except OSError as exc:
            self.error = f"{self.path}: cannot read the file: {exc.strerror}"
            return False
        if mtime == self._mtime:
            return False
        self._mtime = mtime
        try:
            config = load_model(self.path, BenchConfig)
        except SpecError as exc:
            self.error = str(exc)
            return False
        self.current, self.error = config, None
        return True
