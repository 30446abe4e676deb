"""Host figures for node telemetry read straight from /proc (Linux), so the
agent needs no extra dependency: CPU busy share since the last sample, memory
and load."""

from __future__ import annotations

import os
from pathlib import Path


class HostSampler:
    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last: tuple[int, int] | None = None

    def _cpu_times(self) -> tuple[int, int]:
        fields = (self.proc / "stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def cpu_pct(self) -> float:
        total, idle = self._cpu_times()
        last, self._last = self._last, (total, idle)
        if last is None or total == last[0]:
            return 0.0
        return round(100.0 * (1 - (idle - last[1]) / (total - last[0])), 2)

    def memory(self) -> tuple[int, int]:
        info = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
        total = info.get("MemTotal", 0)
        return total - info.get("MemAvailable", 0), total

    @staticmethod
    def load1() -> float:
        return os.getloadavg()[0]
