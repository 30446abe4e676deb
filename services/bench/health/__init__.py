"""The node-health catalogue: periodic probes of what fails at scale (RDMA
ports and GIDs, PCIe AER and link training, kernel-log errors, GPU RAS and
retired pages, driver drift, mounts, NVMe, host settings). ``CATALOGUE``
maps each probe kind to its entry (``base.HealthProbe``); the bench agent
runs them on the schedule of its configuration (services/bench/config.py).
"""

from __future__ import annotations

from services.bench.health import (
    gpu_ras,
    host_settings,
    kernel_log,
    pcie,
    rdma,
    storage,
    versions,
)
from services.bench.health.base import HealthProbe

# Each module lists its probes in PROBES.
_MODULES = (gpu_ras, host_settings, kernel_log, pcie, rdma, storage, versions)


def _catalogue() -> dict[str, HealthProbe]:
    out: dict[str, HealthProbe] = {}
    for module in _MODULES:
        for probe in module.PROBES:
            if probe.kind in out:
                raise ValueError(f"health probe kind {probe.kind} is defined twice")
            out[probe.kind] = probe
    return out


CATALOGUE: dict[str, HealthProbe] = _catalogue()
