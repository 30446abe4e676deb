"""The node-health catalogue: periodic probes of what fails at scale (RDMA
ports and GIDs, PCIe AER and link training, kernel-log errors, GPU RAS and
retired pages, driver drift, mounts, NVMe, host settings). ``CATALOGUE``
maps each probe kind to its entry (``base.HealthProbe``); the bench agent
runs them on the schedule of its configuration (services/bench/config.py).
"""

from __future__ import annotations

from services.bench.health.base import HealthProbe

# Each module lists its probes in PROBES.
_MODULES: tuple[str, ...] = ("kernel_log", "gpu_ras", "versions", "host_settings",
                           "rdma", "pcie", "storage")


def _catalogue() -> dict[str, HealthProbe]:
    import importlib

    out: dict[str, HealthProbe] = {}
    for name in _MODULES:
        for probe in importlib.import_module(f"services.bench.health.{name}").PROBES:
            if probe.kind in out:
                raise ValueError(f"health probe kind {probe.kind} is defined twice")
            out[probe.kind] = probe
    return out


CATALOGUE: dict[str, HealthProbe] = _catalogue()
