"""Parse ``nvidia-smi nvlink -s`` (``--status``): each GPU's NVLink links and their rates.

The bench judges a node's intra-node collectives against what its links allow
(services/bench/link_rates.py); on NVIDIA parts those links are NVLinks, and
this command is where the driver says how many are up and at what rate. Its
output is one header per GPU and one line per link::

    GPU 0: NVIDIA H100 PCIe (UUID: GPU-6968dfc2-...)
             Link 0: 26.562 GB/s
             Link 4: <inactive>

The rate is per link and per direction (NVLink 4: two lanes of 106.25 Gb/s,
26.562 GB/s; NVLink 3 on an A100: 25 GB/s), so a GPU's links summed are what
it can send at once. ``<inactive>`` is a link that is not trained: by design
on some boards (an H100 PCIe pair bridged over 12 of its 18 links), a fault
where the GPU's peers have it up. A GPU without NVLink prints its header and
no links.

Pure: text in, numbers out. Running nvidia-smi lives in the bench's shell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libs.gpu.model import ToolOutputError

TOOL = "nvidia-smi"

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK = re.compile(r"^Link (\d+): (.*?)\s*$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?) GB/s$")


@dataclass(frozen=True)
class NvlinkGpu:
    """One GPU's links: link number -> GB/s per direction, None when inactive."""

    index: int
    name: str
    uuid: str | None
    links: dict[int, float | None]

    @property
    def active(self) -> dict[int, float]:
        return {n: rate for n, rate in self.links.items() if rate}


def parse_nvlink_status(text: str) -> dict[int, NvlinkGpu]:
    """GPU index -> its NVLinks, from ``nvidia-smi nvlink -s``.

    An empty result means no GPU header at all (no NVIDIA GPU, or a driver
    that printed only an error). Raises ToolOutputError on a link line before
    any GPU header, a link listed twice, or a rate it cannot read.
    """
    gpus: dict[int, NvlinkGpu] = {}
    current: NvlinkGpu | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if header := _GPU.match(line):
            index = int(header.group(1))
            if index in gpus:
                raise ToolOutputError(TOOL, f"nvlink: GPU {index} appears twice (line {number})")
            current = NvlinkGpu(index, header.group(2).strip(), header.group(3), {})
            gpus[index] = current
            continue
        link = _LINK.match(line)
        if link is None:
            continue  # blank lines, and notes such as a driver's warning
        if current is None:
            raise ToolOutputError(TOOL, f"nvlink: link line before any GPU (line {number})")
        n = int(link.group(1))
        if n in current.links:
            raise ToolOutputError(TOOL, f"nvlink: GPU {current.index} link {n} appears twice")
        current.links[n] = _rate(link.group(2), current.index, n)
    return gpus


def _rate(value: str, gpu: int, link: int) -> float | None:
    if value.lower() in ("<inactive>", "inactive"):
        return None
    rate = _RATE.match(value)
    if rate is None:
        raise ToolOutputError(TOOL, f"nvlink: GPU {gpu} link {link} has rate {value!r}")
    return float(rate.group(1)) or None  # "0 GB/s": a link that is not up
