"""The storage probes (services/bench/health/storage.py): mounts present and
writable (a hung write returns within its timeout), and NVMe SMART health
from ``nvme smart-log`` (the recorded text output in fixtures/health; the
JSON cases are built from nvme-cli's json_smart_log keys, see the README)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from services.bench.health import CATALOGUE, storage
from services.bench.health.base import ProbeContext, ToolOutput, ToolUnavailable, run_tool
from services.bench.health.storage import (
    SmartLog,
    check_mounts,
    check_nvme_health,
    parse_mounts,
    parse_smart_log,
    smart_problems,
)

FIXTURES = Path(__file__).parent / "fixtures" / "health"
SMART_TEXT = (FIXTURES / "nvme_smart_log_wd_2tb.txt").read_text()


def smart_json(**changes) -> str:
    """The recorded drive's values under the keys nvme-cli's json_smart_log
    writes (src/nvme-print-json.c); constructed, not recorded."""
    fields = {"critical_warning": 0, "temperature": 315, "avail_spare": 100, "spare_thresh": 10,
              "percent_used": 3, "endurance_grp_critical_warning_summary": 0,
              "data_units_read": 201526305, "data_units_written": 188048213,
              "host_read_commands": 660948177, "host_write_commands": 251748228,
              "controller_busy_time": 4612, "power_cycles": 6, "power_on_hours": 241,
              "unsafe_shutdowns": 0, "media_errors": 0, "num_err_log_entries": 1,
              "warning_temp_time": 0, "critical_comp_time": 0}
    return json.dumps({**fields, **changes}, indent=2)


# ---------------------------------------------------------------------- mounts


def mounted(root: Path, *lines: str) -> Path:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/mounts").write_text("".join(line + "\n" for line in lines))
    return root


ROOTFS = "overlay / overlay rw,relatime,lowerdir=/l,upperdir=/u,workdir=/w 0 0"
NFS = "10.0.0.5:/ckpt /mnt/ckpt nfs4 rw,relatime,vers=4.2,hard,proto=tcp 0 0"


def test_parse_mounts_unescapes_spaces():
    mounts = parse_mounts(ROOTFS + "\n/dev/sdb1 /mnt/my\\040data ext4 ro,noatime 0 0\nbad\n")
    assert [m.point for m in mounts] == ["/", "/mnt/my data"]
    assert "ro" in mounts[1].options and mounts[1].fstype == "ext4"


def test_mounts_not_applicable_without_paths(tmp_path):
    assert check_mounts(ProbeContext(root=tmp_path)).status == "not_applicable"


def test_mounts_ok_and_failed(tmp_path):
    root = mounted(tmp_path, ROOTFS, NFS, "/dev/sdb1 /mnt/ro ext4 ro,noatime 0 0")
    for path in ("mnt/ckpt", "mnt/ro", "mnt/plain"):
        (root / path).mkdir(parents=True)
    ok = check_mounts(ProbeContext(root=root, options={"paths": ["/mnt/ckpt/"]}))
    assert ok.status == "ok" and ok.detail == "mounted and writable: /mnt/ckpt (nfs4)"
    assert list((root / "mnt/ckpt").iterdir()) == []  # the probe file is gone
    bad = check_mounts(ProbeContext(root=root, options={"paths": ["/mnt/ckpt", "/mnt/ro",
                                                                  "/mnt/plain"]}))
    assert bad.status == "failed"
    assert bad.detail == "/mnt/ro mounted read-only (ext4 /dev/sdb1); /mnt/plain not mounted"


def test_mount_write_error_is_failed(tmp_path, monkeypatch):
    root = mounted(tmp_path, NFS)
    (root / "mnt/ckpt").mkdir(parents=True)

    def refuse(directory):
        raise OSError(122, "Disk quota exceeded")
    monkeypatch.setattr(storage, "_write_probe", refuse)
    found = check_mounts(ProbeContext(root=root, options={"paths": ["/mnt/ckpt"]}))
    assert found.detail == "/mnt/ckpt (nfs4): not writable: Disk quota exceeded"


def test_a_hung_mount_returns_within_the_timeout(tmp_path, monkeypatch):
    root = mounted(tmp_path, NFS)
    (root / "mnt/ckpt").mkdir(parents=True)
    release, started = threading.Event(), []

    def hang(directory):
        started.append(directory)
        release.wait(30)
    monkeypatch.setattr(storage, "_write_probe", hang)
    ctx = ProbeContext(root=root, options={"paths": ["/mnt/ckpt"], "write_timeout_s": 0.3})
    try:
        began = time.monotonic()
        found = check_mounts(ctx)
        assert time.monotonic() - began < 2
        assert found.status == "failed"
        assert "write did not finish within 0.3 s" in found.detail
        again = check_mounts(ctx)  # still stuck: no second writer
        assert "still hung" in again.detail and len(started) == 1
    finally:
        release.set()
    ctx.state["hung_writes"][str(root / "mnt/ckpt")].join(5)
    assert check_mounts(ctx).status == "ok"


# ---------------------------------------------------------------------- NVMe parsers


def test_parse_recorded_smart_log_text():
    assert parse_smart_log(SMART_TEXT) == SmartLog(critical_warning=0, avail_spare=100,
                                                   spare_thresh=10, percent_used=3, media_errors=0)


def test_parse_smart_log_json_forms():
    assert parse_smart_log(smart_json()).percent_used == 3
    verbose = json.loads(smart_json())
    verbose["critical_warning"] = {"value": 4, "available_spare": 0, "temp_threshold": 0,
                                   "reliability_degraded": 1, "ro": 0, "vmbu_failed": 0,
                                   "pmr_ro": 0}  # -H
    verbose["media_errors"] = "1,024"  # some nvme-cli versions print counters as strings
    log = parse_smart_log(json.dumps(verbose))
    assert log.critical_warning == 4 and log.media_errors == 1024


@pytest.mark.parametrize("text", ["", "Segmentation fault", "[1, 2]",
                                  json.dumps({"critical_warning": 0})])
def test_parse_smart_log_refuses_what_it_cannot_read(text):
    with pytest.raises(ValueError):
        parse_smart_log(text)


def test_smart_problems():
    worn = SmartLog(critical_warning=0x09, avail_spare=5, spare_thresh=10, percent_used=97,
                    media_errors=3)
    assert smart_problems(worn, max_percent_used=90, media_errors_before=1) == [
        "critical_warning 0x09 (spare below threshold, read-only)",
        "available spare 5% below its threshold 10%",
        "97% of rated endurance used (over 90%)",
        "media errors 1 -> 3"]


# ---------------------------------------------------------------------- nvme_health


def nvme_root(root: Path, *names: str) -> Path:
    for name in names:
        (root / "sys/class/nvme" / name).mkdir(parents=True)
    return root


def replay(outputs: dict[str, str] | None = None, *, rc: int = 0, error: str | None = None):
    def run(argv, timeout_s):
        if error:
            raise ToolUnavailable(error)
        return ToolOutput(rc, (outputs or {}).get(argv[2], ""), "" if rc == 0 else "bad ioctl")
    return run


def test_nvme_ok_and_media_error_growth(tmp_path):
    root = nvme_root(tmp_path, "nvme0", "nvme1")
    outputs = {"/dev/nvme0": smart_json(media_errors=7), "/dev/nvme1": SMART_TEXT}
    ctx = ProbeContext(root=root, run=replay(outputs))
    first = check_nvme_health(ctx)  # seven media errors from long ago: the baseline
    assert first.status == "ok" and first.detail == "nvme0 3% used, nvme1 3% used"
    outputs["/dev/nvme0"] = smart_json(media_errors=9)
    found = check_nvme_health(ctx)
    assert found.status == "failed" and found.detail == "nvme0: media errors 7 -> 9"


def test_nvme_failed_on_warning_and_wear(tmp_path):
    root = nvme_root(tmp_path, "nvme0")
    run = replay({"/dev/nvme0": smart_json(critical_warning=4, percent_used=95)})
    found = check_nvme_health(ProbeContext(root=root, run=run))
    assert found.status == "failed"
    assert found.detail == ("nvme0: critical_warning 0x04 (reliability degraded), "
                            "95% of rated endurance used (over 90%)")


@pytest.mark.parametrize("run, reason", [
    (replay(error="nvme: not installed"), "nvme: not installed"),
    (replay(error="nvme: no answer within 30 s"), "no answer within 30 s"),
    (replay({"/dev/nvme0": "garbage"}), "nvme0: unparseable smart-log"),
    (replay(rc=1), "nvme0: nvme exited 1 (bad ioctl)"),
])
def test_nvme_unknown(tmp_path, run, reason):
    found = check_nvme_health(ProbeContext(root=nvme_root(tmp_path, "nvme0"), run=run))
    assert found.status == "unknown" and reason in found.detail


def test_nvme_not_applicable(tmp_path):
    assert check_nvme_health(ProbeContext(root=tmp_path)).status == "not_applicable"


# ---------------------------------------------------------------------- this machine


@pytest.mark.parametrize("kind", ["mounts", "nvme_health"])
def test_probe_on_this_machine_never_fails(kind):
    entry = CATALOGUE[kind]
    found = entry.run(ProbeContext(run=run_tool, options=dict(entry.options), timeout_s=10))
    assert found.status in ("ok", "not_applicable", "unknown"), found
