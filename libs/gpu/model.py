"""One vocabulary for what every GPU tool reports.

amd-smi, rocm-smi, nvidia-smi and the amdgpu sysfs files each name, nest and
unit their readings differently. The bench agent's health probes and the Lens
node sampler should not care which one answered, so every parser in this
package returns the same frozen models, already in SI-ish base units (bytes,
watts, degrees Celsius, MHz, GT/s). Every reading is optional except the index,
because no tool reports everything on every GPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ToolOutputError(ValueError):
    """A tool's output could not be understood.

    Raised by the pure parsers instead of IndexError/KeyError/JSONDecodeError so
    that callers see which tool produced the text and what was wrong with it.
    """

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"{tool}: {detail}")
        self.tool = tool
        self.detail = detail


class GpuSample(BaseModel):
    """One GPU's readings at one moment, normalised across tools.

    Temperatures: ``temp_edge_c`` is the primary board/die sensor (AMD "edge",
    NVIDIA ``temperature.gpu``); ``temp_junction_c`` is the hottest spot (AMD
    "junction"/"hotspot"); ``temp_memory_c`` is VRAM/HBM.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, description="tool's device index (card/GPU number)")
    uuid: str | None = None
    serial: str | None = None
    pci_bus: str | None = Field(default=None, description="PCI bus id, e.g. 0000:83:00.0")
    name: str | None = Field(default=None, description="marketing/model name")
    utilization_pct: float | None = Field(default=None, ge=0)
    vram_used_bytes: int | None = Field(default=None, ge=0)
    vram_total_bytes: int | None = Field(default=None, ge=0)
    temp_edge_c: float | None = None
    temp_junction_c: float | None = None
    temp_memory_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    power_cap_w: float | None = Field(default=None, ge=0)
    sclk_mhz: float | None = Field(default=None, ge=0, description="graphics/SM clock")
    mclk_mhz: float | None = Field(default=None, ge=0, description="memory clock")
    ecc_correctable: int | None = Field(default=None, ge=0)
    ecc_uncorrectable: int | None = Field(default=None, ge=0)
    pcie_link_speed_gts: float | None = Field(default=None, ge=0)
    pcie_link_width: int | None = Field(default=None, ge=0)
    xgmi_errors: int | None = Field(
        default=None,
        ge=0,
        description="XGMI error count; amd-smi reports a status, mapped 0=none, 1=one, 2=several",
    )

    @property
    def hottest_c(self) -> float | None:
        """The highest of the temperatures this tool reported, if any."""
        readings = (self.temp_edge_c, self.temp_junction_c, self.temp_memory_c)
        temps = [t for t in readings if t is not None]
        return max(temps) if temps else None

    def filled_from(self, other: GpuSample) -> GpuSample:
        """A copy whose missing readings are taken from ``other`` (same GPU, another tool)."""
        gaps = {
            name: getattr(other, name)
            for name in type(self).model_fields
            if getattr(self, name) is None and getattr(other, name) is not None
        }
        return self.model_copy(update=gaps) if gaps else self


class GpuInventory(BaseModel):
    """All GPUs one tool reported, with the tool's identity."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool: str
    tool_version: str | None = None
    driver_version: str | None = None
    gpus: tuple[GpuSample, ...] = ()

    def merged_with(self, other: GpuInventory) -> GpuInventory:
        """Fill this inventory's gaps from ``other``, matching GPUs by index.

        Used to combine ``amd-smi metric`` (live readings) with ``amd-smi static``
        (names, caps, sizes). GPUs only ``other`` knows about are appended.
        """
        theirs = {g.index: g for g in other.gpus}
        ours = {g.index for g in self.gpus}
        merged = [g.filled_from(theirs[g.index]) if g.index in theirs else g for g in self.gpus]
        merged += [g for g in other.gpus if g.index not in ours]
        return self.model_copy(
            update={
                "gpus": tuple(sorted(merged, key=lambda g: g.index)),
                "tool_version": self.tool_version or other.tool_version,
                "driver_version": self.driver_version or other.driver_version,
            }
        )


def build_sample(tool: str, **readings: object) -> GpuSample:
    """A GpuSample, with a reading the model rejects (say, -5 W) reported as ToolOutputError."""
    try:
        return GpuSample.model_validate(readings)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "sample"
        where = f"GPU {readings.get('index')}" if "index" in readings else "GPU"
        raise ToolOutputError(
            tool, f"{where}: {field} {first['msg'].lower()} (got {first.get('input')!r})"
        ) from error


ProbeStatus = Literal["ok", "unavailable", "error"]


class ProbeResult(BaseModel):
    """What ``probe_gpus`` found: an inventory, or why there is none.

    ``unavailable``: no tool on PATH, or the tool timed out / could not start.
    ``error``: a tool ran but failed or printed something we could not parse.
    ``attempts`` keeps one line per tool tried, for the operator.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: ProbeStatus
    tool: str | None = None
    reason: str | None = None
    inventory: GpuInventory | None = None
    attempts: tuple[str, ...] = ()
