"""GPU management-tool readings for the bench agent's probes and the Lens sampler.

Parsers are pure functions from a tool's text to ``GpuInventory`` (XGMI link
counters, which are cumulative, to ``XgmiTotals``; XGMI and NVLink link rates to
``XgmiLinks`` and ``NvlinkGpu``); ``probe_gpus`` is the one
entry point that looks for and runs tools. See ``model`` for units.
"""

from libs.gpu.amd_smi import parse_amd_smi_json, parse_amd_smi_version
from libs.gpu.amd_smi_xgmi import (
    XgmiLinks,
    XgmiTotals,
    parse_amd_smi_xgmi_json,
    parse_amd_smi_xgmi_links,
    xgmi_rates,
)
from libs.gpu.model import GpuInventory, GpuSample, ProbeResult, ToolOutputError
from libs.gpu.nvidia_smi import QUERY_FIELDS, parse_nvidia_smi_csv, parse_nvidia_smi_xml
from libs.gpu.nvidia_smi_nvlink import NvlinkGpu, parse_nvlink_status
from libs.gpu.rocm_smi import parse_rocm_smi, parse_rocm_smi_json, parse_rocm_smi_table
from libs.gpu.runner import probe_gpus
from libs.gpu.sysfs import read_amdgpu_sysfs

__all__ = [
    "QUERY_FIELDS",
    "GpuInventory",
    "GpuSample",
    "NvlinkGpu",
    "ProbeResult",
    "ToolOutputError",
    "XgmiLinks",
    "XgmiTotals",
    "parse_amd_smi_json",
    "parse_amd_smi_version",
    "parse_amd_smi_xgmi_json",
    "parse_amd_smi_xgmi_links",
    "parse_nvidia_smi_csv",
    "parse_nvidia_smi_xml",
    "parse_nvlink_status",
    "parse_rocm_smi",
    "parse_rocm_smi_json",
    "parse_rocm_smi_table",
    "probe_gpus",
    "read_amdgpu_sysfs",
    "xgmi_rates",
]
