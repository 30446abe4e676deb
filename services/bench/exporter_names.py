"""The bench agent's node readings as a Prometheus page, under the names and
labels GPU dashboards already query: AMD's device-metrics-exporter on AMD
nodes, NVIDIA's dcgm-exporter on NVIDIA nodes (pure: no I/O, no clock).

``READINGS`` is the one table: for every GPU reading of the telemetry
contract (``GpuMetrics``) the exporter metric it is published as, the factor
from our unit to the exporter's and the unit itself, and a platform name
(``primus_gpu_*``) for a reading an exporter has no metric of the same
meaning for. Which exporter's names a page uses follows the tool that
answered (``naming``): nvidia-smi → dcgm-exporter's, amd-smi, rocm-smi and
the amdgpu sysfs files → AMD's. The names are checked against the exporters'
published lists (tests/bench_agent/fixtures/exporters/).

Labels follow each exporter: AMD's ``gpu_id``, ``gpu_uuid``,
``serial_number``, ``card_series``, ``card_model`` (the exporter falls back
to the series where it knows no model number: so do we, the tools giving only
the marketing name) and ``hostname``; dcgm-exporter's ``gpu``, ``UUID``,
``pci_bus_id``, ``device`` (``nvidia<N>``), ``modelName`` and ``Hostname``.
Both add the platform's ``job_id`` (AMD's exporter's own label for the
scheduler's job, empty when no job holds the GPU, as it does for Slurm) and
``rank`` (the worker's rank, empty when idle). The Kubernetes labels (pod,
namespace, container) are left to the exporters that read the kubelet.

Every series is a gauge, as AMD's exporter publishes them all: a page
rendered from tool readings cannot promise a counter never goes back (a
driver reload resets ECC totals), and prometheus-client would append
``_total`` to a counter's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client.core import GaugeMetricFamily, Metric

from libs.events import GpuMetrics, NodeTelemetryData

Naming = Literal["amd", "nvidia"]
MIB = 1024 * 1024  # amd-smi's and the AMD exporter's "MB" of VRAM are 2**20 bytes

AMD_LABELS: tuple[str, ...] = ("gpu_id", "gpu_uuid", "serial_number", "card_series",
                               "card_model", "hostname")
DCGM_LABELS: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
JOB_LABELS: tuple[str, ...] = ("job_id", "rank")  # the platform's: whose work the GPU does
# The tools whose readings are AMD GPUs (libs.gpu's tool names).
AMD_TOOLS = frozenset({"amd-smi", "rocm-smi", "sysfs"})


@dataclass(frozen=True)
class GpuIdentity:
    """What names one GPU on a page: the inventory's, kept by the sampler
    (the telemetry contract carries only the index)."""

    index: int
    uuid: str | None = None
    serial: str | None = None
    pci_bus: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Exported:
    """One exporter's metric for a reading: its name, the factor from our
    unit to its unit, the unit, and labels the metric carries besides the
    GPU's (AMD's clocks are one metric told apart by ``clock_type``)."""

    name: str
    scale: float
    unit: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Reading:
    """One GPU reading and how each exporter publishes it."""

    key: str  # the GpuMetrics field, or a reading derived from them (vram_free_bytes)
    unit: str  # our unit
    help: str
    platform: str  # used where the page's exporter has no metric for it
    amd: Exported | None = None
    dcgm: Exported | None = None
    read: Callable[[GpuMetrics], float | None] | None = field(default=None, compare=False)

    def value(self, gpu: GpuMetrics) -> float | None:
        got = self.read(gpu) if self.read is not None else getattr(gpu, self.key)
        return None if got is None else float(got)

    def exported(self, naming: Naming) -> Exported:
        chosen = self.amd if naming == "amd" else self.dcgm
        return chosen if chosen is not None else Exported(self.platform, 1.0, self.unit)


def _vram_free(gpu: GpuMetrics) -> float | None:
    if gpu.vram_total_bytes is None or gpu.vram_used_bytes is None:
        return None
    return float(max(0, gpu.vram_total_bytes - gpu.vram_used_bytes))


_PER_MIB = 1 / MIB
# Units of the exporters' metrics, from their published lists: AMD's
# docs/configuration/metricslist.md ("in Celsius", "in Watts", "in MB",
# "in Mhz", percentage 0-100) and dcgm-exporter's etc/*.csv ("in C", "in W",
# "in MiB", "in MHz", "in %", PCIe "in bytes per second").
READINGS: tuple[Reading, ...] = (
    Reading("util_pct", "%", "GPU busy share (graphics engine / SM)",
            "primus_gpu_utilization_percent",
            amd=Exported("gpu_gfx_activity", 1.0, "percent (0-100)"),
            dcgm=Exported("DCGM_FI_DEV_GPU_UTIL", 1.0, "percent (0-100)")),
    Reading("vram_used_bytes", "bytes", "VRAM in use", "primus_gpu_vram_used_bytes",
            amd=Exported("gpu_used_vram", _PER_MIB, "MB (2^20 bytes)"),
            dcgm=Exported("DCGM_FI_DEV_FB_USED", _PER_MIB, "MiB")),
    Reading("vram_total_bytes", "bytes", "VRAM size", "primus_gpu_vram_total_bytes",
            amd=Exported("gpu_total_vram", _PER_MIB, "MB (2^20 bytes)")),
    Reading("vram_free_bytes", "bytes", "VRAM free (size less used)", "primus_gpu_vram_free_bytes",
            amd=Exported("gpu_free_vram", _PER_MIB, "MB (2^20 bytes)"),
            dcgm=Exported("DCGM_FI_DEV_FB_FREE", _PER_MIB, "MiB"), read=_vram_free),
    Reading("temp_c", "°C", "edge (primary) temperature", "primus_gpu_temperature_celsius",
            amd=Exported("gpu_edge_temperature", 1.0, "°C"),
            dcgm=Exported("DCGM_FI_DEV_GPU_TEMP", 1.0, "°C")),
    Reading("temp_junction_c", "°C", "junction (hotspot) temperature",
            "primus_gpu_junction_temperature_celsius",
            amd=Exported("gpu_junction_temperature", 1.0, "°C")),
    Reading("temp_hbm_c", "°C", "memory (HBM/VRAM) temperature",
            "primus_gpu_memory_temperature_celsius",
            amd=Exported("gpu_memory_temperature", 1.0, "°C"),
            dcgm=Exported("DCGM_FI_DEV_MEMORY_TEMP", 1.0, "°C")),
    Reading("power_w", "W", "power draw (AMD: socket power)", "primus_gpu_power_watts",
            amd=Exported("gpu_package_power", 1.0, "W"),
            dcgm=Exported("DCGM_FI_DEV_POWER_USAGE", 1.0, "W")),
    Reading("power_cap_w", "W", "power cap", "primus_gpu_power_cap_watts"),
    Reading("sclk_mhz", "MHz", "graphics/SM clock", "primus_gpu_sclk_mhz",
            amd=Exported("gpu_clock", 1.0, "MHz",
                         (("clock_index", "0"), ("clock_type", "system"))),
            dcgm=Exported("DCGM_FI_DEV_SM_CLOCK", 1.0, "MHz")),
    Reading("mclk_mhz", "MHz", "memory clock", "primus_gpu_mclk_mhz",
            amd=Exported("gpu_clock", 1.0, "MHz",
                         (("clock_index", "0"), ("clock_type", "memory"))),
            dcgm=Exported("DCGM_FI_DEV_MEM_CLOCK", 1.0, "MHz")),
    Reading("ecc_correctable", "errors", "correctable ECC errors (volatile)",
            "primus_gpu_ecc_correctable",
            amd=Exported("gpu_ecc_correct_total", 1.0, "errors"),
            dcgm=Exported("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 1.0, "errors")),
    Reading("ecc_uncorrectable", "errors", "uncorrectable ECC errors (volatile)",
            "primus_gpu_ecc_uncorrectable",
            amd=Exported("gpu_ecc_uncorrect_total", 1.0, "errors"),
            dcgm=Exported("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0, "errors")),
    # AMD's pcie_rx/pcie_tx and gpu_xgmi_link_rx/_tx are totals since the
    # driver loaded (bytes, KB per link), pcie_bandwidth a Mb/s sum: none is
    # a rate in each direction, so ours keep platform names there.
    Reading("pcie_rx_bytes_s", "bytes/s", "PCIe bytes received per second (pcie_bw)",
            "primus_gpu_pcie_rx_bytes_per_second",
            dcgm=Exported("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0, "bytes/s")),
    Reading("pcie_tx_bytes_s", "bytes/s", "PCIe bytes sent per second (pcie_bw)",
            "primus_gpu_pcie_tx_bytes_per_second",
            dcgm=Exported("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0, "bytes/s")),
    Reading("xgmi_rx_bytes_s", "bytes/s", "XGMI bytes read per second, all links",
            "primus_gpu_xgmi_rx_bytes_per_second"),
    Reading("xgmi_tx_bytes_s", "bytes/s", "XGMI bytes written per second, all links",
            "primus_gpu_xgmi_tx_bytes_per_second"),
)


def naming(tool: str | None, choice: str = "auto") -> Naming | None:
    """Which exporter's names a page uses: the setting's, or by the tool
    that answered; None when no tool answered (no GPU series then)."""
    if choice in ("amd", "nvidia"):
        return choice  # type: ignore[return-value]
    if tool is None:
        return None
    return "nvidia" if tool == "nvidia-smi" else "amd"


def gpu_labels(naming_: Naming, gpu: GpuMetrics, identity: GpuIdentity | None,
               hostname: str) -> list[str]:
    """The label values of one GPU, in the order of ``label_names(naming_)``."""
    who = identity or GpuIdentity(index=gpu.index)
    job = ([gpu.job or "", str(gpu.rank)] if gpu.job is not None and gpu.rank is not None
           else ["", ""])
    if naming_ == "amd":
        return [str(gpu.index), who.uuid or "", who.serial or "", who.name or "",
                who.name or "", hostname, *job]
    return [str(gpu.index), who.uuid or "", who.pci_bus or "", f"nvidia{gpu.index}",
            who.name or "", hostname, *job]


def label_names(naming_: Naming) -> tuple[str, ...]:
    return (AMD_LABELS if naming_ == "amd" else DCGM_LABELS) + JOB_LABELS


def gpu_families(gpus: Sequence[GpuMetrics], identities: Mapping[int, GpuIdentity],
                 hostname: str, naming_: Naming) -> list[Metric]:
    """One gauge family per exported name, a sample per GPU that has the reading."""
    base = label_names(naming_)
    families: dict[str, GaugeMetricFamily] = {}
    for reading in READINGS:
        exported = reading.exported(naming_)
        extra = tuple(k for k, _ in exported.labels)
        family = families.get(exported.name)
        if family is None:
            family = families[exported.name] = GaugeMetricFamily(
                exported.name, f"{reading.help} ({exported.unit})", labels=[*extra, *base])
        for gpu in gpus:
            value = reading.value(gpu)
            if value is None:
                continue
            labels = gpu_labels(naming_, gpu, identities.get(gpu.index), hostname)
            family.add_metric([*(v for _, v in exported.labels), *labels],
                              value * exported.scale)
    return [f for f in families.values() if f.samples]


def host_families(data: NodeTelemetryData, hostname: str) -> Iterator[Metric]:
    """The host's readings as ``primus_host_*`` gauges (node_exporter's
    meanings, rates instead of counters: the sampler reports rates)."""
    host = ("hostname",)

    def one(name: str, doc: str, value: float) -> GaugeMetricFamily:
        return _family(name, doc, host, [((hostname,), value)])

    yield one("primus_host_cpu_busy_percent", "CPU busy share, all cores (0-100)", data.cpu_pct)
    yield one("primus_host_memory_used_bytes", "memory in use (total less available)",
              data.mem_used_bytes)
    yield one("primus_host_memory_total_bytes", "memory size", data.mem_total_bytes)
    yield one("primus_host_load1", "load average over one minute", data.load1)
    nic = ("device", "rdma", "hostname")
    yield _family("primus_host_network_receive_bytes_per_second",
                  "bytes received per second (rdma: an InfiniBand/RoCE port)", nic,
                  [((n.name, _bool(n.rdma), hostname), n.rx_bytes_s) for n in data.nics])
    yield _family("primus_host_network_transmit_bytes_per_second",
                  "bytes sent per second (rdma: an InfiniBand/RoCE port)", nic,
                  [((n.name, _bool(n.rdma), hostname), n.tx_bytes_s) for n in data.nics])
    disk = ("device", "hostname")
    yield _family("primus_host_disk_read_bytes_per_second", "bytes read per second", disk,
                  [((d.name, hostname), d.read_bytes_s) for d in data.disks])
    yield _family("primus_host_disk_written_bytes_per_second", "bytes written per second", disk,
                  [((d.name, hostname), d.write_bytes_s) for d in data.disks])
    fs = ("mountpoint", "hostname")
    yield _family("primus_host_filesystem_avail_bytes", "space free to non-root users", fs,
                  [((f.mount, hostname), f.free_bytes) for f in data.filesystems])
    yield _family("primus_host_filesystem_size_bytes", "filesystem size", fs,
                  [((f.mount, hostname), f.total_bytes) for f in data.filesystems])


@dataclass(frozen=True)
class PageSample:
    """What the page is rendered from: the agent's last telemetry sample
    (GPUs attributed to their workers), the GPUs' identities, the tool that
    answered and when (monotonic seconds). Immutable: the scrape thread takes
    a reference while the event loop goes on to the next one."""

    data: NodeTelemetryData
    identities: Mapping[int, GpuIdentity]
    tool: str | None
    taken_at: float


def render(sample: PageSample | None, hostname: str, *, choice: str = "auto",
           now: float) -> list[Metric]:
    """Every family of the node's page from its last sample (none before the first)."""
    if sample is None:
        return []
    out: list[Metric] = [_family(
        "primus_telemetry_sample_age_seconds", "how long ago the readings on this page were "
        "taken (the page shows the agent's last telemetry sample)", ("hostname",),
        [((hostname,), max(0.0, now - sample.taken_at))])]
    chosen = naming(sample.tool, choice)
    if chosen is not None and sample.data.gpus:
        out += gpu_families(sample.data.gpus, sample.identities, hostname, chosen)
    out += host_families(sample.data, hostname)
    return out


def table_rows() -> Iterable[tuple[str, str, str, str, str]]:
    """The mapping as rows (reading, our unit, AMD name [unit], dcgm-exporter
    name [unit], the platform's name where an exporter has none), for the README."""
    def shown(exported: Exported | None) -> str:
        if exported is None:
            return "—"
        extra = ",".join(f'{k}="{v}"' for k, v in exported.labels if k != "clock_index")
        return f"`{exported.name}{{{extra}}}` ({exported.unit})" if extra else \
            f"`{exported.name}` ({exported.unit})"

    for r in READINGS:
        yield (f"`{r.key}`", r.unit, shown(r.amd), shown(r.dcgm), f"`{r.platform}`")


def _family(name: str, doc: str, labels: Sequence[str],
            values: Iterable[tuple[Sequence[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for label_values, value in values:
        family.add_metric([str(v) for v in label_values], float(value))
    return family


def _bool(flag: bool) -> str:
    return "true" if flag else "false"
