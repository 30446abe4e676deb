"""The amdgpu sysfs fallback, read from a fake /sys tree built in tmp_path."""

from __future__ import annotations

from pathlib import Path

from libs.gpu import read_amdgpu_sysfs


def write(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content + "\n", encoding="utf-8")


def build_tree(root: Path) -> None:
    drm = root / "sys" / "class" / "drm"
    # card0: a fully populated AMD GPU whose device link points at its PCI address.
    pci = root / "sys" / "devices" / "pci0000:80" / "0000:83:00.0"
    write(pci / "vendor", "0x1002")
    write(pci / "gpu_busy_percent", "37")
    write(pci / "mem_info_vram_used", "1073741824")
    write(pci / "mem_info_vram_total", "68702699520")
    write(pci / "unique_id", "79ccd55167a2124a")
    write(pci / "current_link_speed", "16.0 GT/s PCIe")
    write(pci / "current_link_width", "16")
    hwmon = pci / "hwmon" / "hwmon3"
    for sensor, (label, milli_c) in enumerate(
        [("edge", "45000"), ("junction", "52000"), ("mem", "48000")], start=1
    ):
        write(hwmon / f"temp{sensor}_label", label)
        write(hwmon / f"temp{sensor}_input", milli_c)
    write(hwmon / "power1_average", "91000000")
    write(hwmon / "power1_cap", "560000000")
    write(hwmon / "freq1_input", "800000000")
    write(hwmon / "freq2_input", "1600000000")
    write(pci / "ras" / "umc_err_count", "ue: 0\nce: 3")
    write(pci / "ras" / "gfx_err_count", "ue: 1\nce: 2")
    write(pci / "ras" / "xgmi_wafl_err_count", "ue: 0\nce: 0")
    (drm / "card0").mkdir(parents=True)
    (drm / "card0" / "device").symlink_to(pci)
    # A display connector entry and an NVIDIA card: both skipped.
    (drm / "card0-DP-1").mkdir()
    write(drm / "card1" / "device" / "vendor", "0x10de")
    # card2: a sparse AMD GPU (newer kernel: power1_input; unlabelled temp1).
    sparse = drm / "card2" / "device"
    write(sparse / "vendor", "0x1002")
    write(sparse / "hwmon" / "hwmon5" / "temp1_input", "39000")
    write(sparse / "hwmon" / "hwmon5" / "power1_input", "20500000")
    write(sparse / "gpu_busy_percent", "garbage")
    write(root / "sys" / "module" / "amdgpu" / "version", "6.10.5")


def test_reads_amd_cards_in_order_and_skips_others(tmp_path: Path) -> None:
    build_tree(tmp_path)

    inventory = read_amdgpu_sysfs(tmp_path)

    assert inventory.tool == "sysfs"
    assert inventory.driver_version == "6.10.5"
    assert [g.index for g in inventory.gpus] == [0, 1]


def test_full_card_readings_are_in_base_units(tmp_path: Path) -> None:
    build_tree(tmp_path)

    gpu = read_amdgpu_sysfs(tmp_path).gpus[0]

    assert gpu.pci_bus == "0000:83:00.0"
    assert gpu.uuid == "79ccd55167a2124a"
    assert gpu.utilization_pct == 37.0
    assert gpu.vram_used_bytes == 1_073_741_824
    assert gpu.vram_total_bytes == 68_702_699_520
    assert (gpu.temp_edge_c, gpu.temp_junction_c, gpu.temp_memory_c) == (45.0, 52.0, 48.0)
    assert gpu.power_w == 91.0
    assert gpu.power_cap_w == 560.0
    assert (gpu.sclk_mhz, gpu.mclk_mhz) == (800.0, 1600.0)
    assert (gpu.pcie_link_speed_gts, gpu.pcie_link_width) == (16.0, 16)
    assert (gpu.ecc_correctable, gpu.ecc_uncorrectable) == (5, 1)  # summed over RAS blocks
    assert gpu.xgmi_errors == 0


def test_sparse_card_leaves_unknown_readings_empty(tmp_path: Path) -> None:
    build_tree(tmp_path)

    gpu = read_amdgpu_sysfs(tmp_path).gpus[1]

    assert gpu.temp_edge_c == 39.0
    assert gpu.power_w == 20.5
    assert gpu.utilization_pct is None  # unparsable file: no reading, no exception
    assert gpu.vram_total_bytes is None
    assert gpu.ecc_correctable is None
    assert gpu.pci_bus is None


def test_missing_tree_is_an_empty_inventory(tmp_path: Path) -> None:
    assert read_amdgpu_sysfs(tmp_path).gpus == ()
