"""The mapping table against the exporters' published lists: every metric
name, its unit and every label name the bench agent's /metrics page uses
under an exporter's name are the exporter's own (fixtures cited in
tests/bench_agent/fixtures/exporters/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

from libs.events import GpuMetrics
from services.bench.exporter_names import (
    AMD_LABELS,
    DCGM_LABELS,
    JOB_LABELS,
    READINGS,
    label_names,
    naming,
    table_rows,
)

FIXTURES = Path(__file__).parent / "fixtures" / "exporters"
# What the exporters publish a page in our unit's place, per reading's unit
# note in its list (AMD's metricslist.md descriptions, dcgm-exporter's CSV help).
AMD_UNIT_WORDS = {"°C": "Celsius", "W": "Watts", "MB (2^20 bytes)": "in MB", "MHz": "Mhz",
                  "percent (0-100)": "(0 - 100)", "errors": "error count"}
DCGM_UNIT_WORDS = {"°C": "(in C)", "W": "(in W)", "MiB": "(in MiB)", "MHz": "(in MHz)",
                   "percent (0-100)": "(in %)", "bytes/s": "in bytes per second",
                   "errors": "ECC errors"}


def amd_fields() -> set[str]:
    """GPUMetricField names of AMD's exporter config (its Prometheus names are
    these, lower-cased: gpuagent_gpu_metrics.go registers "gpu_gfx_activity"
    for GPU_GFX_ACTIVITY and so on)."""
    proto = (FIXTURES / "amd_exporterconfig_fields_labels.proto").read_text()
    block = proto.split("enum GPUMetricField {", 1)[1].split("}", 1)[0]
    return set(re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*=", block, re.M))


def amd_labels() -> set[str]:
    proto = (FIXTURES / "amd_exporterconfig_fields_labels.proto").read_text()
    block = proto.split("enum GPUMetricLabel {", 1)[1].split("}", 1)[0]
    return {name.lower() for name in re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*=", block, re.M)}


def amd_descriptions() -> dict[str, str]:
    """Field -> description, from the metric list's tables."""
    out = {}
    for line in (FIXTURES / "amd_metricslist_excerpt.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.match(r"([A-Z][A-Z0-9_]+)\b", cells[2])):
            out[m.group(1)] = cells[3]
    return out


def dcgm_fields() -> dict[str, tuple[str, str]]:
    """Field -> (Prometheus type, help) of both CSVs, lines commented out
    included (fields the exporter takes, off by default); a field's line in
    force wins over a commented one (the DCP list has PCIe bytes as both)."""
    active: dict[str, tuple[str, str]] = {}
    commented: dict[str, tuple[str, str]] = {}
    for name in ("dcgm_exporter_default_counters.csv", "dcgm_exporter_dcp_metrics_included.csv"):
        for line in (FIXTURES / name).read_text().splitlines():
            m = re.match(r"^(#?)\s*(DCGM_\w+)\s*,\s*(\w+)\s*,\s*(.*)$", line)
            if m:
                (commented if m.group(1) else active).setdefault(m.group(2),
                                                                 (m.group(3), m.group(4)))
    return {**commented, **active}


def dcgm_labels() -> set[str]:
    """The GPU series' labels in dcgm-exporter's template; ``{{ $metric.UUID }}``
    is the label name "UUID" (gpu_collector.go: ``uuid := "UUID"``, "uuid"
    only with the old-namespace flag)."""
    template = (FIXTURES / "dcgm_exporter_gpu_metrics_format.tmpl").read_text()
    assert '{{ $metric.UUID }}="{{ $metric.GPUUUID }}"' in template
    return set(re.findall(r'[,{]([A-Za-z_]+)="\{\{', template)) | {"UUID"}


def test_every_amd_name_is_a_published_field_with_the_same_unit() -> None:
    fields, described = amd_fields(), amd_descriptions()
    named = [r for r in READINGS if r.amd is not None]
    assert len(named) >= 12
    for reading in named:
        assert reading.amd is not None
        field = reading.amd.name.upper()
        assert field in fields, f"{reading.key}: {field} is not a GPUMetricField"
        assert reading.amd.name == reading.amd.name.lower()
        assert AMD_UNIT_WORDS[reading.amd.unit] in described[field], (reading.key, field)


def test_every_dcgm_name_is_a_published_field_with_the_same_unit() -> None:
    fields = dcgm_fields()
    named = [r for r in READINGS if r.dcgm is not None]
    assert len(named) >= 11
    for reading in named:
        assert reading.dcgm is not None
        assert reading.dcgm.name in fields, f"{reading.key}: {reading.dcgm.name} not published"
        kind, help_text = fields[reading.dcgm.name]
        assert kind in ("gauge", "counter")
        assert DCGM_UNIT_WORDS[reading.dcgm.unit] in help_text, (reading.key, help_text)


def test_label_names_are_the_exporters_own_plus_the_platforms_job_labels() -> None:
    assert set(AMD_LABELS) <= amd_labels()
    assert {"gpu_id", "serial_number", "hostname", "job_id"} <= set(AMD_LABELS + JOB_LABELS)
    assert set(DCGM_LABELS) <= dcgm_labels()
    assert label_names("amd")[-2:] == label_names("nvidia")[-2:] == ("job_id", "rank")
    # AMD's extra clock labels are the exporter's too (GPU_CLOCK: clock_index, clock_type).
    assert {k for r in READINGS if r.amd for k, _ in r.amd.labels} == {"clock_index",
                                                                       "clock_type"}


def test_every_reading_of_the_contract_is_on_the_page_under_one_name_per_naming() -> None:
    contract = set(GpuMetrics.model_fields) - {"index", "job", "attempt", "rank"}
    assert contract <= {r.key for r in READINGS}
    for chosen in ("amd", "nvidia"):
        names = [(r.exported(chosen).name, r.exported(chosen).labels) for r in READINGS]
        assert len(names) == len(set(names)), chosen  # no two readings on one series
    platform = [r.platform for r in READINGS]
    assert len(platform) == len(set(platform))
    assert all(p.startswith("primus_gpu_") for p in platform)


def test_the_tool_that_answered_picks_the_naming_unless_the_setting_does() -> None:
    assert naming("nvidia-smi") == "nvidia"
    assert naming("amd-smi") == naming("rocm-smi") == naming("sysfs") == "amd"
    assert naming(None) is None
    assert naming("nvidia-smi", "amd") == "amd" and naming(None, "nvidia") == "nvidia"


def test_the_readme_shows_the_table_as_the_module_has_it() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for row in table_rows():
        assert "| " + " | ".join(row) + " |" in readme, row
