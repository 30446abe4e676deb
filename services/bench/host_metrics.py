"""Host figures for node telemetry, read straight from /proc and /sys (Linux),
so the agent needs no extra dependency: CPU busy share, memory, load, bytes
per second in and out of every NIC (RDMA ports from /sys/class/infiniband
too), disk reads and writes, and free space of real filesystems.

Everything is read under a root path so tests point it at a fake tree; rates
are differences between two samples over the time the injected clock says
passed. A file that is missing or unreadable leaves its figure out: /proc
and /sys differ between kernels and containers, and telemetry must not fail
because of one file.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from libs.events import DiskMetrics, FsMetrics, NicMetrics

# Filesystems worth watching: local disks, network and parallel filesystems,
# and the shared memory that data loaders live in.
REAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "nfs", "nfs4", "lustre", "gpfs",
    "beegfs", "ceph", "cifs", "smb3", "wekafs", "fuse.juicefs"})
WATCHED_TMPFS = frozenset({"/dev/shm"})
SKIPPED_DISKS = ("loop", "ram", "zram", "fd", "sr")
SECTOR = 512
IB_WORD = 4  # port_rcv_data / port_xmit_data count 4-byte words


@dataclass
class HostSample:
    cpu_pct: float
    mem_used_bytes: int
    mem_total_bytes: int
    load1: float
    nics: list[NicMetrics] = field(default_factory=list)
    disks: list[DiskMetrics] = field(default_factory=list)
    filesystems: list[FsMetrics] = field(default_factory=list)


class HostSampler:
    def __init__(self, proc: Path = Path("/proc"), *, root: Path | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.root = root if root is not None else proc.parent
        self.proc = self.root / "proc" if root is not None else proc
        self.sys = self.root / "sys"
        self.clock = clock
        self.statvfs = statvfs
        self._last: tuple[int, int] | None = None
        self._counters: dict[str, tuple[float, float]] = {}  # name -> (a, b) totals
        self._counted_at: float | None = None

    def sample(self) -> HostSample:
        """Every figure at once; rates are since the previous sample (0 on the first)."""
        now = self.clock()
        elapsed = None if self._counted_at is None else now - self._counted_at
        self._counted_at = now
        used, total = self.memory()
        nics = [NicMetrics(name=n, rx_bytes_s=rx, tx_bytes_s=tx)
                for n, (rx, tx) in self._rates("net:", _net_dev(self.proc), elapsed)]
        nics += [NicMetrics(name=n, rx_bytes_s=rx, tx_bytes_s=tx, rdma=True)
                 for n, (rx, tx) in self._rates("ib:", _infiniband(self.sys), elapsed)]
        disks = [DiskMetrics(name=n, read_bytes_s=r, write_bytes_s=w)
                 for n, (r, w) in self._rates("disk:", _disk_stats(self.proc, self.sys),
                                              elapsed)]
        return HostSample(cpu_pct=self.cpu_pct(), mem_used_bytes=used, mem_total_bytes=total,
                          load1=self.load1(), nics=nics, disks=disks,
                          filesystems=self.filesystems())

    def _rates(self, prefix: str, totals: dict[str, tuple[float, float]],
               elapsed: float | None) -> list[tuple[str, tuple[float, float]]]:
        out = []
        for name, (a, b) in sorted(totals.items()):
            key = prefix + name
            last = self._counters.get(key)
            self._counters[key] = (a, b)
            if last is None or not elapsed or elapsed <= 0:
                out.append((name, (0.0, 0.0)))
                continue
            # A counter that went backwards (wrapped, device reset) gives 0, not a negative.
            out.append((name, (max(0.0, a - last[0]) / elapsed, max(0.0, b - last[1]) / elapsed)))
        return out

    def _cpu_times(self) -> tuple[int, int]:
        fields = (self.proc / "stat").read_text().splitlines()[0].split()[1:]
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    def cpu_pct(self) -> float:
        try:
            total, idle = self._cpu_times()
        except (OSError, ValueError, IndexError):
            return 0.0
        last, self._last = self._last, (total, idle)
        if last is None or total == last[0]:
            return 0.0
        return round(max(0.0, 100.0 * (1 - (idle - last[1]) / (total - last[0]))), 2)

    def memory(self) -> tuple[int, int]:
        info = {}
        with contextlib.suppress(OSError):
            for line in (self.proc / "meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                with contextlib.suppress(ValueError, IndexError):
                    info[key] = int(rest.split()[0]) * 1024
        total = info.get("MemTotal", 0)
        return max(0, total - info.get("MemAvailable", total)), total

    def load1(self) -> float:
        try:
            return max(0.0, float((self.proc / "loadavg").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            return 0.0

    def filesystems(self) -> list[FsMetrics]:
        out: dict[str, FsMetrics] = {}
        for mount, fstype in _mounts(self.proc):
            if fstype not in REAL_FILESYSTEMS and mount not in WATCHED_TMPFS:
                continue
            try:
                st = self.statvfs(str(self.root / mount.lstrip("/")))
            except OSError:
                continue
            out[mount] = FsMetrics(mount=mount, free_bytes=st.f_bavail * st.f_frsize,
                                   total_bytes=st.f_blocks * st.f_frsize)
        return list(out.values())


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _net_dev(proc: Path) -> dict[str, tuple[float, float]]:
    """Bytes received and sent per interface, loopback left out."""
    out = {}
    for line in _read(proc / "net" / "dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        name = name.strip()
        if name and name != "lo" and len(fields) >= 9:
            with contextlib.suppress(ValueError):
                out[name] = (float(fields[0]), float(fields[8]))
    return out


def _infiniband(sys: Path) -> dict[str, tuple[float, float]]:
    """Bytes received and sent per RDMA port (``mlx5_0/1``)."""
    out = {}
    base = sys / "class" / "infiniband"
    with contextlib.suppress(OSError):
        for device in sorted(os.listdir(base)):
            with contextlib.suppress(OSError):
                for port in sorted(os.listdir(base / device / "ports")):
                    counters = base / device / "ports" / port / "counters"
                    with contextlib.suppress(ValueError):
                        rx = int(_read(counters / "port_rcv_data").strip()) * IB_WORD
                        tx = int(_read(counters / "port_xmit_data").strip()) * IB_WORD
                        out[f"{device}/{port}"] = (float(rx), float(tx))
    return out


def _disk_stats(proc: Path, sys: Path) -> dict[str, tuple[float, float]]:
    """Bytes read and written per whole disk (partitions and loop devices left out)."""
    try:
        whole = set(os.listdir(sys / "block"))
    except OSError:
        whole = set()
    out = {}
    for line in _read(proc / "diskstats").splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        name = fields[2]
        if name.startswith(SKIPPED_DISKS) or (whole and name not in whole):
            continue
        with contextlib.suppress(ValueError):
            out[name] = (float(fields[5]) * SECTOR, float(fields[9]) * SECTOR)
    return out


def _mounts(proc: Path) -> list[tuple[str, str]]:
    out = []
    for line in _read(proc / "mounts").splitlines():
        fields = line.split()
        if len(fields) >= 3:
            # /proc/mounts escapes spaces and tabs in paths as octal.
            mount = fields[1].replace("\\040", " ").replace("\\011", "\t")
            out.append((mount, fields[2]))
    return out
