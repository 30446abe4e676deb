"""The agent's node sampler over a fake /proc and /sys tree and fake GPU
tools: host rates from two samples, RDMA ports, whole disks, real
filesystems; GPU readings mapped from any tool; a missing tool probed once
and then left alone until its retry time."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

from libs.gpu import GpuInventory, GpuSample, ProbeResult
from services.bench.host_metrics import HostSampler
from services.bench.node_sampler import GpuSource, NodeSampler, to_metrics


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_host(root: Path, *, busy: int, rx: int, ib_words: int, sectors: int,
              idle: int = 1000) -> None:
    write(root, "proc/stat", f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    write(root, "proc/meminfo", "MemTotal:       1000 kB\nMemFree:   100 kB\n"
                                "MemAvailable:    400 kB\n")
    write(root, "proc/loadavg", "3.50 2.00 1.00 2/300 12345\n")
    write(root, "proc/net/dev",
          "Inter-|   Receive                            |  Transmit\n"
          " face |bytes    packets errs drop fifo frame compressed multicast|bytes packets\n"
          f"    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
          f"  eth0: {rx} 10 0 0 0 0 0 0 {rx // 2} 5 0 0 0 0 0 0\n")
    for port in ("1",):
        base = f"sys/class/infiniband/mlx5_0/ports/{port}/counters"
        write(root, f"{base}/port_rcv_data", f"{ib_words}\n")
        write(root, f"{base}/port_xmit_data", f"{ib_words * 2}\n")
    write(root, "proc/diskstats",
          f" 259 0 nvme0n1 10 0 {sectors} 5 20 0 {sectors * 2} 9 0 0 0\n"
          f" 259 1 nvme0n1p1 10 0 {sectors} 5 20 0 {sectors} 9 0 0 0\n"
          f"   7 0 loop0 1 0 {sectors} 1 0 0 0 0 0 0 0\n")
    (root / "sys/block/nvme0n1").mkdir(parents=True, exist_ok=True)
    (root / "sys/block/loop0").mkdir(parents=True, exist_ok=True)
    write(root, "proc/mounts", "/dev/nvme0n1p1 / ext4 rw 0 0\nproc /proc proc rw 0 0\n"
                               "tmpfs /dev/shm tmpfs rw 0 0\n"
                               "fs:/data /mnt/my\\040data nfs4 rw 0 0\ntmpfs /run tmpfs rw 0 0\n")
    for mount in ("dev/shm", "mnt/my data"):
        (root / mount).mkdir(parents=True, exist_ok=True)


def statvfs(path: str) -> os.statvfs_result:
    return SimpleNamespace(f_bavail=250, f_frsize=4096, f_blocks=1000)  # type: ignore[return-value]


def test_host_figures_and_rates_from_a_fake_tree(tmp_path: Path) -> None:
    clock = Clock()
    fake_host(tmp_path, busy=100, rx=1000, ib_words=100, sectors=10)
    host = HostSampler(root=tmp_path, clock=clock, statvfs=statvfs)
    first = host.sample()
    assert first.mem_used_bytes == 600 * 1024 and first.mem_total_bytes == 1000 * 1024
    assert first.load1 == 3.5 and all(n.rx_bytes_s == 0 for n in first.nics)
    clock.t += 2.0
    fake_host(tmp_path, busy=600, rx=5000, ib_words=600, sectors=110, idle=1300)
    s = host.sample()
    assert s.cpu_pct == 62.5  # 500 busy of 800 ticks
    nics = {n.name: n for n in s.nics}
    assert set(nics) == {"eth0", "mlx5_0/1"}  # loopback left out
    assert nics["eth0"].rx_bytes_s == 2000 and nics["eth0"].tx_bytes_s == 1000
    assert nics["mlx5_0/1"].rdma and nics["mlx5_0/1"].rx_bytes_s == 500 * 4 / 2
    assert [d.name for d in s.disks] == ["nvme0n1"]  # no partitions, no loop devices
    assert s.disks[0].read_bytes_s == 100 * 512 / 2 and s.disks[0].write_bytes_s == 200 * 512 / 2
    mounts = {f.mount: f for f in s.filesystems}
    assert set(mounts) == {"/", "/dev/shm", "/mnt/my data"}
    assert mounts["/"].free_bytes == 250 * 4096 and mounts["/"].total_bytes == 1000 * 4096


def test_missing_files_leave_figures_out_instead_of_failing(tmp_path: Path) -> None:
    host = HostSampler(root=tmp_path, clock=Clock())
    s = host.sample()
    assert (s.cpu_pct, s.mem_total_bytes, s.load1, s.nics, s.disks, s.filesystems) == (
        0.0, 0, 0.0, [], [], [])


def gpu(index: int, **kw: object) -> GpuSample:
    return GpuSample(index=index, **kw)  # type: ignore[arg-type]


class FakeProbe:
    def __init__(self, results: list[ProbeResult]) -> None:
        self.results, self.calls = results, []

    def __call__(self, tools: tuple[str, ...], timeout_s: float, *, sysfs_root: object
                 ) -> ProbeResult:
        self.calls.append(tools)
        return self.results[min(len(self.calls), len(self.results)) - 1]


NONE = ProbeResult(status="unavailable", reason="amd-smi: not found on PATH")
AMD = ProbeResult(status="ok", tool="amd-smi", inventory=GpuInventory(tool="amd-smi", gpus=(
    gpu(0, utilization_pct=99.0, temp_edge_c=70.0, temp_junction_c=90.0, temp_memory_c=80.0,
        power_w=700.0, power_cap_w=750.0, vram_used_bytes=10, vram_total_bytes=20,
        ecc_correctable=1, ecc_uncorrectable=0, sclk_mhz=2100.0, mclk_mhz=1300.0,
        pci_bus="0000:83:00.0"),
    gpu(1))))


def test_a_missing_tool_is_probed_once_then_left_alone_until_the_retry(tmp_path: Path) -> None:
    clock, probe = Clock(), FakeProbe([NONE, NONE, AMD])
    source = GpuSource(probe=probe, sysfs_root=tmp_path, retry_s=300, clock=clock)
    assert source.read() == (None, [])
    for _ in range(100):  # a hundred ticks cost no probe
        clock.t += 1
        assert source.read() == (None, [])
    assert len(probe.calls) == 1
    clock.t += 300
    source.read()
    clock.t += 300
    tool, gpus = source.read()  # the tool appeared (driver installed)
    assert tool == "amd-smi" and [g.index for g in gpus] == [0, 1]
    assert len(probe.calls) == 3


def test_the_tool_that_answered_is_the_only_one_run_afterwards(tmp_path: Path) -> None:
    probe = FakeProbe([AMD])
    source = GpuSource(probe=probe, sysfs_root=tmp_path, clock=Clock())
    for _ in range(3):
        assert source.read()[0] == "amd-smi"
    assert probe.calls[0] == ("amd-smi", "rocm-smi", "nvidia-smi")
    assert probe.calls[1:] == [("amd-smi",), ("amd-smi",)]


def test_readings_map_onto_the_telemetry_contract() -> None:
    assert AMD.inventory is not None
    m = to_metrics(AMD.inventory.gpus[0], (2.0e9, 1.0e9))
    assert (m.util_pct, m.temp_c, m.temp_junction_c, m.temp_hbm_c) == (99.0, 70.0, 90.0, 80.0)
    assert (m.power_w, m.power_cap_w, m.vram_used_bytes, m.ecc_correctable) == (700, 750, 10, 1)
    assert (m.pcie_rx_bytes_s, m.pcie_tx_bytes_s, m.sclk_mhz) == (2.0e9, 1.0e9, 2100.0)


def test_pcie_throughput_from_amdgpu_sysfs(tmp_path: Path) -> None:
    pci = tmp_path / "sys/devices/pci0000:80/0000:83:00.0"
    write(pci.parent.parent.parent, "devices/pci0000:80/0000:83:00.0/pcie_bw", "1000 500 256\n")
    (tmp_path / "sys/class/drm/card0").mkdir(parents=True)
    (tmp_path / "sys/class/drm/card0/device").symlink_to(pci)
    source = GpuSource(probe=FakeProbe([AMD]), sysfs_root=tmp_path, clock=Clock())
    _, gpus = source.read()
    assert (gpus[0].pcie_rx_bytes_s, gpus[0].pcie_tx_bytes_s) == (256000.0, 128000.0)
    assert gpus[1].pcie_rx_bytes_s is None


async def test_one_sample_holds_the_host_and_every_gpu(tmp_path: Path) -> None:
    fake_host(tmp_path, busy=100, rx=1000, ib_words=100, sectors=10)
    sampler = NodeSampler(host=HostSampler(root=tmp_path, clock=Clock(), statvfs=statvfs),
                          gpus=GpuSource(probe=FakeProbe([AMD]), sysfs_root=tmp_path,
                                         clock=Clock()))
    data = await sampler.sample()
    assert data.gpu_tool == "amd-smi" and len(data.gpus) == 2
    assert {n.name for n in data.nics} == {"eth0", "mlx5_0/1"}


async def test_a_slow_tool_never_delays_the_tick(tmp_path: Path) -> None:
    import time

    class Slow:
        def read(self) -> tuple[str | None, list[object]]:
            time.sleep(1.0)
            return "amd-smi", []

    sampler = NodeSampler(host=HostSampler(root=tmp_path, clock=Clock()), gpus=Slow(),  # type: ignore[arg-type]
                          first_wait_s=0.05)
    started = time.monotonic()
    for _ in range(3):
        await sampler.sample()
    assert time.monotonic() - started < 0.5
    await asyncio.sleep(1.1)
    assert (await sampler.sample()).gpu_tool == "amd-smi"
