"""The PCIe probes (services/bench/health/pcie.py): AER statistics parsed
from the kernel's recorded sample output, link training and AER growth on
fake /sys/bus/pci trees (values in the kernel's formats)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.bench.health import CATALOGUE, pcie
from services.bench.health.base import ProbeContext, run_tool
from services.bench.health.pcie import (
    Link,
    check_pcie_aer,
    check_pcie_links,
    device_kind,
    link_problems,
    parse_aer,
    parse_link_speed,
)

FIXTURES = Path(__file__).parent / "fixtures" / "health"
CORRECTABLE = (FIXTURES / "aer_dev_correctable_kernel_abi.txt").read_text()
FATAL = (FIXTURES / "aer_dev_fatal_kernel_abi.txt").read_text()
NONFATAL = (FIXTURES / "aer_dev_nonfatal_kernel_abi.txt").read_text()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def device(
    root: Path,
    bdf: str,
    *,
    cls: str,
    vendor: str,
    speed: str = "32.0 GT/s PCIe",
    width: str = "16",
    max_speed: str = "32.0 GT/s PCIe",
    max_width: str = "16",
    parent: str | None = None,
    aer: bool = True,
    power: str | None = None,
) -> Path:
    """A function under sys/devices/pci0000:00[/<parent>]/<bdf>, linked from
    sys/bus/pci/devices/<bdf> as on a real host."""
    where = root / "sys/devices/pci0000:00" / (parent or "") / bdf
    files = {
        "class": cls,
        "vendor": vendor,
        "current_link_speed": speed,
        "current_link_width": width,
        "max_link_speed": max_speed,
        "max_link_width": max_width,
    }
    if aer:
        files |= {
            "aer_dev_correctable": CORRECTABLE.strip(),
            "aer_dev_fatal": FATAL.strip(),
            "aer_dev_nonfatal": NONFATAL.strip(),
        }
    if power:
        files["power_state"] = power
    for name, value in files.items():
        write(where / name, value)
    link = root / "sys/bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(where, link.parent))
    return where


def gpu(root: Path, bdf: str = "0000:05:00.0", **kw) -> Path:
    return device(root, bdf, cls="0x120000", vendor="0x1002", **kw)


def nic(root: Path, bdf: str = "0000:0c:00.0", **kw) -> Path:
    return device(root, bdf, cls="0x020700", vendor="0x15b3", **kw)


def bump(path: Path, name: str, counter: str, by: int) -> None:
    lines = []
    for line in (path / name).read_text().splitlines():
        key, _, count = line.rpartition(" ")
        if key in (
            counter,
            "TOTAL_ERR_"
            + {
                "aer_dev_fatal": "FATAL",
                "aer_dev_nonfatal": "NONFATAL",
                "aer_dev_correctable": "COR",
            }[name],
        ):
            count = str(int(count) + by)
        lines.append(f"{key} {count}")
    (path / name).write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------- parsers


def test_parse_aer_kernel_samples():
    assert parse_aer(CORRECTABLE) == {
        "Receiver Error": 2,
        "Bad TLP": 0,
        "Bad DLLP": 0,
        "RELAY_NUM Rollover": 0,
        "Replay Timer Timeout": 0,
        "Advisory Non-Fatal": 0,
        "Corrected Internal Error": 0,
        "Header Log Overflow": 0,
        "TOTAL_ERR_COR": 2,
    }
    assert len(parse_aer(FATAL)) == 18 and parse_aer(FATAL)["TOTAL_ERR_FATAL"] == 0
    assert parse_aer(NONFATAL)["Completion Timeout"] == 0


def test_parse_aer_refuses_garbage():
    with pytest.raises(ValueError):
        parse_aer("Receiver Error two\n")


def test_link_speed_and_class():
    assert parse_link_speed("16.0 GT/s PCIe") == 16.0
    assert parse_link_speed("8 GT/s") == 8.0  # kernels before 5.7
    assert parse_link_speed("Unknown") is None and parse_link_speed("Unknown speed") is None
    assert device_kind("0x030200", "0x10de") == "gpu"
    assert device_kind("0x120000", "0x1002") == "gpu"
    assert device_kind("0x020000", "0x8086") == "nic"
    assert device_kind("0x030000", "0x1a03") is None  # a BMC's VGA


def test_link_problems_width_strict_gpu_speed_noted():
    slow = Link("0000:05:00.0", "gpu", 2.5, 16, 32.0, 16)
    assert link_problems(slow, upstream=None, gpu_speed_strict=False) == (
        [],
        ["GPU 0000:05:00.0 at 2.5 GT/s, capable of 32 (idle GPUs retrain lower)"],
    )
    narrow = Link("0000:0c:00.0", "nic", 32.0, 8, 32.0, 16)
    assert link_problems(narrow, upstream=None, gpu_speed_strict=False)[0] == [
        "NIC 0000:0c:00.0 at x8, capable of x16"
    ]


# ---------------------------------------------------------------------- pcie_links


def test_pcie_links_ok(tmp_path):
    gpu(tmp_path)
    nic(tmp_path)
    found = check_pcie_links(ProbeContext(root=tmp_path))
    assert found.status == "ok" and found.detail == "2 links at full width"


def test_pcie_links_failed_names_device_and_both_figures(tmp_path):
    gpu(tmp_path, width="8")
    nic(tmp_path, speed="16.0 GT/s PCIe")
    found = check_pcie_links(ProbeContext(root=tmp_path))
    assert found.status == "failed"
    assert "GPU 0000:05:00.0 at x8, capable of x16" in found.detail
    assert "NIC 0000:0c:00.0 at 16 GT/s, capable of 32" in found.detail


def test_idle_gpu_speed_is_a_note_unless_strict(tmp_path):
    gpu(tmp_path, speed="2.5 GT/s PCIe")
    assert check_pcie_links(ProbeContext(root=tmp_path)).status == "ok"
    strict = check_pcie_links(ProbeContext(root=tmp_path, options={"gpu_speed_strict": True}))
    assert strict.status == "failed" and "at 2.5 GT/s, capable of 32" in strict.detail


def test_the_slot_caps_what_is_expected(tmp_path):
    # a Gen5 NIC behind a Gen4 root port trains at Gen4: not degraded
    bridge = tmp_path / "sys/devices/pci0000:00/0000:00:01.1"
    for name, value in (
        ("max_link_speed", "16.0 GT/s PCIe"),
        ("max_link_width", "16"),
        ("current_link_speed", "16.0 GT/s PCIe"),
        ("current_link_width", "16"),
    ):
        write(bridge / name, value)
    nic(tmp_path, speed="16.0 GT/s PCIe", parent="0000:00:01.1")
    assert check_pcie_links(ProbeContext(root=tmp_path)).status == "ok"


def test_a_suspended_gpu_is_not_a_down_link(tmp_path):
    gpu(tmp_path, speed="Unknown", width="0", power="D3cold")
    assert check_pcie_links(ProbeContext(root=tmp_path)).status == "not_applicable"
    gpu(tmp_path, bdf="0000:06:00.0", speed="Unknown", width="0")
    found = check_pcie_links(ProbeContext(root=tmp_path))
    assert found.status == "failed" and "GPU 0000:06:00.0 link down" in found.detail


def test_pcie_links_not_applicable(tmp_path):
    assert check_pcie_links(ProbeContext(root=tmp_path)).status == "not_applicable"
    write(tmp_path / "sys/bus/pci/devices/0000:00:03.0/class", "0x020000")  # virtio-net: no link
    write(tmp_path / "sys/bus/pci/devices/0000:00:03.0/vendor", "0x1af4")
    assert check_pcie_links(ProbeContext(root=tmp_path)).status == "not_applicable"


# ---------------------------------------------------------------------- pcie_aer


@pytest.fixture
def clock(monkeypatch):
    now = [1_000_000.0]
    monkeypatch.setattr(pcie, "_clock", lambda: now[0])
    return now


def test_aer_growth_between_runs(tmp_path, clock):
    where = gpu(tmp_path)
    ctx = ProbeContext(root=tmp_path)
    first = check_pcie_aer(ctx)  # Receiver Error 2 from long ago: the baseline
    assert first.status == "ok", first
    clock[0] += 60
    assert check_pcie_aer(ctx).status == "ok"
    bump(where, "aer_dev_nonfatal", "Completion Timeout", 1)
    clock[0] += 60
    found = check_pcie_aer(ctx)
    assert found.status == "failed"
    assert found.detail == "GPU 0000:05:00.0 nonfatal AER errors: Completion Timeout +1"
    clock[0] += 60
    assert check_pcie_aer(ctx).status == "ok"  # no further growth


def test_correctable_growth_fails_only_above_the_rate(tmp_path, clock):
    where = nic(tmp_path)
    ctx = ProbeContext(root=tmp_path, options={"max_correctable_per_hour": 600})
    check_pcie_aer(ctx)
    bump(where, "aer_dev_correctable", "Receiver Error", 5)
    clock[0] += 60
    assert check_pcie_aer(ctx).status == "ok"  # 300/h
    bump(where, "aer_dev_correctable", "Bad TLP", 50)
    clock[0] += 60
    found = check_pcie_aer(ctx)
    assert found.status == "failed"
    assert (
        "NIC 0000:0c:00.0 50 correctable AER errors in 1 min (Bad TLP +50), over 600/h"
        in found.detail
    )


def test_errors_seen_by_the_upstream_port_are_named(tmp_path, clock):
    bridge = device(tmp_path, "0000:00:01.1", cls="0x060400", vendor="0x1022")
    gpu(tmp_path, parent="0000:00:01.1")
    ctx = ProbeContext(root=tmp_path)
    check_pcie_aer(ctx)
    bump(bridge, "aer_dev_fatal", "Surprise Down Error", 1)
    clock[0] += 60
    found = check_pcie_aer(ctx)
    assert found.detail == (
        "port 0000:00:01.1 (upstream of 0000:05:00.0) fatal AER errors: Surprise Down Error +1"
    )


def test_aer_unparseable_is_unknown(tmp_path, clock):
    where = gpu(tmp_path)
    (where / "aer_dev_fatal").write_text("what is this\n")
    found = check_pcie_aer(ProbeContext(root=tmp_path))
    assert found.status == "unknown" and "not an AER counter line" in found.detail


def test_aer_not_applicable_without_counters(tmp_path, clock):
    assert check_pcie_aer(ProbeContext(root=tmp_path)).status == "not_applicable"
    gpu(tmp_path, aer=False)
    assert check_pcie_aer(ProbeContext(root=tmp_path)).status == "not_applicable"


# ---------------------------------------------------------------------- this machine


@pytest.mark.parametrize("kind", ["pcie_links", "pcie_aer"])
def test_probe_on_this_machine_never_fails(kind):
    entry = CATALOGUE[kind]
    ctx = ProbeContext(run=run_tool, options=dict(entry.options), timeout_s=10)
    for _ in range(2):  # the second AER run compares with the first
        found = entry.run(ctx)
        assert found.status in ("ok", "not_applicable", "unknown"), found
