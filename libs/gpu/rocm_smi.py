"""Parse ``rocm-smi`` output: ``--showallinfo --json`` and the default concise table.

rocm-smi is deprecated in favour of amd-smi but is still what older ROCm nodes
(and many containers) ship, so the bench agent falls back to it. Its JSON is a
flat ``{"cardN": {"Human readable key (unit)": "string value"}}`` map whose key
spellings drift between releases (e.g. "Average Graphics Package Power (W)" vs
"Current Socket Graphics Package Power (W)"), hence the case-insensitive,
first-match lookups below. Plain ``rocm-smi`` prints a fixed-layout "Concise
Info" table whose columns also moved between ROCm 5 and 6; it is parsed from
the right-hand end, which has stayed stable (SCLK MCLK Fan Perf PwrCap VRAM% GPU%).

Pure: text in, models out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from libs.gpu.model import GpuInventory, GpuSample, ToolOutputError, build_sample
from libs.gpu.units import is_missing, load_json, number, text

TOOL = "rocm-smi"

_CARD = re.compile(r"^card(\d+)$", re.IGNORECASE)
_PAREN_MHZ = re.compile(r"\(\s*(\d+(?:\.\d+)?)\s*mhz\s*\)", re.IGNORECASE)
_PCIE_LEVEL = re.compile(r"(\d+(?:\.\d+)?)\s*GT/s,?\s*x(\d+)", re.IGNORECASE)
_TEMP_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:°C|°c|C|c)$")
_POWER_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)W$")

_NAME_KEYS = ("device name", "card series", "card model", "card sku")
_POWER_KEYS = (
    "current socket graphics package power (w)",
    "average graphics package power (w)",
    "current graphics package power (w)",
)


def parse_rocm_smi(raw: str) -> GpuInventory:
    """Parse either form of rocm-smi output, choosing by content."""
    # A JSON document starts a line with "{" (after any WARNING lines); no table line does.
    if raw and re.search(r"^\s*[\[{]", raw, re.MULTILINE):
        return parse_rocm_smi_json(raw)
    return parse_rocm_smi_table(raw)


def parse_rocm_smi_json(raw: str) -> GpuInventory:
    """Parse ``rocm-smi --showallinfo --json`` (or any ``--show* --json`` subset)."""
    document = load_json(raw, tool=TOOL)
    if not isinstance(document, Mapping):
        kind = type(document).__name__
        raise ToolOutputError(TOOL, f"expected a JSON object of cards, got {kind}")
    samples = []
    for key, card in document.items():
        match = _CARD.match(str(key))
        if match is None:
            continue
        if not isinstance(card, Mapping):
            raise ToolOutputError(TOOL, f"entry {key!r} is {type(card).__name__}, not an object")
        samples.append(_card_sample(int(match.group(1)), card))
    if not samples:
        raise ToolOutputError(TOOL, "JSON has no 'cardN' entries")
    system = document.get("system")
    driver = text(_lower_keys(system).get("driver version"))
    return GpuInventory(
        tool=TOOL, driver_version=driver, gpus=tuple(sorted(samples, key=lambda g: g.index))
    )


def parse_rocm_smi_table(raw: str) -> GpuInventory:
    """Parse the "Concise Info" table printed by plain ``rocm-smi``."""
    lines = (raw or "").splitlines()
    header_at = next((i for i, line in enumerate(lines) if "SCLK" in line and "MCLK" in line), None)
    if header_at is None:
        if not (raw or "").strip():
            raise ToolOutputError(TOOL, "no output")
        raise ToolOutputError(TOOL, "no Concise Info header (a line with SCLK and MCLK) found")
    header = " ".join(lines[header_at : header_at + 2])
    temp_field = "temp_junction_c" if re.search(r"junction", header, re.I) else "temp_edge_c"

    samples: list[GpuSample] = []
    for line in lines[header_at + 1 :]:
        stripped = line.strip()
        if not stripped or set(stripped) <= {"="} or "End of ROCm SMI Log" in stripped:
            continue
        if re.match(r"^\d+\s", stripped):
            samples.append(_table_row(stripped, temp_field))
        elif samples and samples[-1].name is None and _is_name_line(line):
            samples[-1] = samples[-1].model_copy(update={"name": stripped})
    if not samples:
        raise ToolOutputError(TOOL, "Concise Info table has no GPU rows")
    return GpuInventory(tool=TOOL, gpus=tuple(samples))


def _is_name_line(line: str) -> bool:
    """The indented model-name line ROCm 6 prints under each row ("   AMD Instinct MI300X")."""
    stripped = line.strip()
    return line[:1].isspace() and not stripped.startswith(("(", "Name ("))


def _table_row(line: str, temp_field: str) -> GpuSample:
    tokens = line.split()
    if len(tokens) < 8:
        raise ToolOutputError(
            TOOL, f"table row has {len(tokens)} columns, expected 8 or more: {line!r}"
        )
    index = int(tokens[0])  # the caller matched the row on ^\d+\s
    # Right-anchored: ... SCLK MCLK Fan Perf PwrCap VRAM% GPU%
    sclk, mclk, _fan, _perf, cap, _vram_pct, gpu_pct = tokens[-7:]
    left = tokens[1:-7]
    temp_at = next((i for i, tok in enumerate(left) if _TEMP_TOKEN.match(tok)), None)
    temp = power = None
    if temp_at is not None:
        temp = number(left[temp_at], tool=TOOL, field="Temp")
        power_token = left[temp_at + 1] if temp_at + 1 < len(left) else None
        if power_token is not None and (_POWER_TOKEN.match(power_token) or is_missing(power_token)):
            power = number(power_token, tool=TOOL, field="Power")
    return build_sample(
        TOOL,
        index=index,
        utilization_pct=number(gpu_pct, tool=TOOL, field="GPU%"),
        power_w=power,
        power_cap_w=_cap(number(cap, tool=TOOL, field="PwrCap")),
        sclk_mhz=number(sclk, tool=TOOL, field="SCLK"),
        mclk_mhz=number(mclk, tool=TOOL, field="MCLK"),
        **{temp_field: temp},
    )


def _cap(watts: float | None) -> float | None:
    """The secondary die of an MI250X reports a 0.0W cap: that means "no cap here", not 0 W."""
    return watts if watts else None


def _lower_keys(node: object) -> dict[str, object]:
    if not isinstance(node, Mapping):
        return {}
    return {str(k).strip().lower(): v for k, v in node.items()}


def _card_sample(index: int, card: Mapping[str, object]) -> GpuSample:
    fields = _lower_keys(card)

    def reading(key: str) -> float | None:
        return number(fields.get(key), tool=TOOL, field=f"card{index}.{key}")

    def first(keys: tuple[str, ...]) -> float | None:
        return next((r for r in (reading(k) for k in keys) if r is not None), None)

    speed, width = _pcie_link(fields.get("pcie clock level"))
    used = reading("vram total used memory (b)")
    total = reading("vram total memory (b)")
    return build_sample(
        TOOL,
        index=index,
        uuid=text(fields.get("unique id")),
        serial=text(fields.get("serial number")),
        pci_bus=text(fields.get("pci bus")),
        name=next((text(fields.get(k)) for k in _NAME_KEYS if text(fields.get(k))), None),
        utilization_pct=reading("gpu use (%)"),
        vram_used_bytes=None if used is None else int(used),
        vram_total_bytes=None if total is None else int(total),
        temp_edge_c=reading("temperature (sensor edge) (c)"),
        temp_junction_c=reading("temperature (sensor junction) (c)"),
        temp_memory_c=first(("temperature (sensor memory) (c)", "temperature (sensor mem) (c)")),
        power_w=first(_POWER_KEYS),
        power_cap_w=_cap(reading("max graphics package power (w)")),
        sclk_mhz=_clock(fields, "sclk", index),
        mclk_mhz=_clock(fields, "mclk", index),
        pcie_link_speed_gts=speed,
        pcie_link_width=width,
    )


def _clock(fields: Mapping[str, object], name: str, index: int) -> float | None:
    """MHz from "sclk clock speed:" "(300Mhz)", or from "sclk clock level" "0 (300Mhz)"."""
    for key in (f"{name} clock speed:", f"{name} clock level", f"{name} clock level:"):
        value = fields.get(key)
        if is_missing(value) or not isinstance(value, str):
            continue
        match = _PAREN_MHZ.search(value)
        if match:
            return float(match.group(1))
        if key.endswith("speed:"):
            raise ToolOutputError(TOOL, f"card{index}.{key} has unexpected value {value!r}")
    return None


def _pcie_link(value: object) -> tuple[float | None, int | None]:
    """ "0 (16.0GT/s x16)" -> (16.0, 16)."""
    if not isinstance(value, str):
        return None, None
    match = _PCIE_LEVEL.search(value)
    if match is None:
        return None, None
    return float(match.group(1)), int(match.group(2))
