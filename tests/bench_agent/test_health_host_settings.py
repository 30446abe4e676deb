"""Host-settings probe: the ACS parser on recorded lspci output, each
sub-check, the combined finding and its options, and this machine."""

from __future__ import annotations

from pathlib import Path

from services.bench.health import host_settings as hs
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable

FIX = Path(__file__).parent / "fixtures" / "health"
NCCL606 = (FIX / "lspci_acsctl_nccl606.txt").read_text()
OPENVMM = (FIX / "lspci_vv_acs_disabled_openvmm.txt").read_text()


def test_parse_acs_grep_output_without_devices():
    ports = hs.parse_acs(NCCL606)
    assert len(ports) == 9 and [p[1]["SrcValid"] for p in ports].count(True) == 4
    assert all(dev == "?" for dev, _ in ports)
    check = hs.check_acs(ports, ["SrcValid"])
    assert check.status == "failed" and "on at 4 of 9 bridge(s)" in check.detail


def test_parse_acs_names_the_bridge():
    (port,) = hs.parse_acs(OPENVMM)
    assert port[0] == "00:00.0" and port[1]["SrcValid"] is False and port[1]["DirectTrans"] is False
    assert hs.check_acs([port], ["SrcValid", "ReqRedir"]).status == "ok"


def test_numa_governor_iommu_checks():
    assert hs.check_numa_balancing("1").status == "failed"
    assert hs.check_numa_balancing("0\n").status == "ok"
    assert hs.check_numa_balancing(None).status == "not_applicable"
    governors = {f"cpu{i}": "performance" for i in range(4)} | {
        "cpu4": "powersave",
        "cpu5": "schedutil",
    }
    check = hs.check_governors(governors, "performance")
    assert (
        check.status == "failed"
        and check.detail == "powersave/schedutil on 2 of 6 CPUs (expected performance)"
    )
    assert hs.check_governors({}, "performance").status == "not_applicable"
    assert hs.check_iommu([], "quiet").status == "not_applicable"
    assert hs.check_iommu(["ivhd0"], "ro quiet iommu=pt").status == "ok"
    assert hs.check_iommu(["dmar0"], "intel_iommu=off").status == "ok"
    assert hs.check_iommu(["ivhd0", "ivhd1"], "ro quiet").status == "failed"


class Runner:
    def __init__(self, answer=None):
        self.answer = answer

    def __call__(self, argv, timeout_s):
        if self.answer is None:
            raise ToolUnavailable(f"{argv[0]}: not installed")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def host(
    tmp_path: Path, *, numa="0", governors=("performance",) * 2, iommu=(), cmdline="ro quiet"
) -> Path:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    if numa is not None:
        (tmp_path / "proc/sys/kernel/numa_balancing").write_text(numa + "\n")
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    for i, g in enumerate(governors):
        d = tmp_path / f"sys/devices/system/cpu/cpu{i}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(g + "\n")
    for unit in iommu:
        (tmp_path / "sys/class/iommu" / unit).mkdir(parents=True)
    return tmp_path


def test_ok_names_every_sub_setting(tmp_path):
    ctx = ProbeContext(
        root=host(tmp_path, iommu=("ivhd0",), cmdline="iommu=pt"),
        run=Runner(ToolOutput(0, OPENVMM, "")),
    )
    found = hs.probe(ctx)
    assert found.status == "ok"
    for name in ("numa_balancing: ok", "cpu_governor: ok", "iommu: ok (pass-through)", "acs: ok"):
        assert name in found.detail


def test_failed_names_what(tmp_path):
    root = host(tmp_path, numa="1", governors=("performance", "powersave"), iommu=("ivhd0",))
    found = hs.probe(ProbeContext(root=root, run=Runner(ToolOutput(0, NCCL606, ""))))
    assert found.status == "failed"
    for part in (
        "numa_balancing: failed (1 (should be 0))",
        "cpu_governor: failed",
        "iommu: failed",
        "acs: failed",
    ):
        assert part in found.detail


def test_options_switch_checks_off(tmp_path):
    root = host(tmp_path, numa="1")
    options = {"check_numa_balancing": False, "check_acs": False}
    found = hs.probe(ProbeContext(root=root, run=Runner(), options=options))
    assert (
        found.status == "ok" and "numa_balancing" not in found.detail and "acs" not in found.detail
    )
    none = {
        "check_numa_balancing": False,
        "check_cpu_governor": False,
        "check_iommu": False,
        "check_acs": False,
    }
    assert hs.probe(ProbeContext(root=root, run=Runner(), options=none)).status == "not_applicable"


def test_not_applicable_in_a_bare_vm(tmp_path):
    root = host(tmp_path, numa=None, governors=())
    found = hs.probe(
        ProbeContext(root=root, run=Runner(ToolOutput(0, "00:00.0 Host bridge: x\n", "")))
    )
    assert found.status == "not_applicable"


def test_lspci_missing_timeout_error_are_unknown_not_failed(tmp_path):
    root = host(tmp_path, numa=None, governors=())
    for runner, reason in (
        (Runner(), "not installed"),
        (Runner(ToolUnavailable("lspci: no answer within 30 s")), "no answer"),
        (Runner(ToolOutput(1, "", "pcilib: cannot open /sys/bus/pci")), "exit 1"),
    ):
        found = hs.probe(ProbeContext(root=root, run=runner))
        assert found.status == "unknown" and reason in found.detail
    unprivileged = "00:01.1 PCI bridge: x\n\tCapabilities: [2a0 v1] Access Control Services\n"
    found = hs.probe(ProbeContext(root=root, run=Runner(ToolOutput(0, unprivileged, ""))))
    assert found.status == "unknown" and "needs root" in found.detail


def test_on_this_machine():
    assert hs.probe(ProbeContext()).status != "failed"
