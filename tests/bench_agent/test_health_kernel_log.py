"""Kernel-log probe: the pattern table on real kernel lines (cited in
fixtures/health/README.md), the dmesg/journal parsers, the cursor, and the
probe on a fake tree and runner and on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.bench.health import kernel_log
from services.bench.health.base import Finding, ProbeContext, ToolOutput, ToolUnavailable

FIX = Path(__file__).parent / "fixtures" / "health"


def lines(name: str) -> list[str]:
    return (FIX / name).read_text(encoding="utf-8").splitlines()


def names(matches) -> list[str]:
    return [m.name for m in matches]


def test_amdgpu_ring_timeout_and_reset_are_hardware():
    found = kernel_log.classify(lines("kmsg_amdgpu_ring_timeout_reset.txt"))
    assert names(found) == ["amdgpu ring timeout", "amdgpu GPU reset"]
    assert all(m.hardware for m in found)


def test_amdgpu_mi300x_ras_uncorrectable_and_aca_events():
    found = kernel_log.classify(lines("kmsg_amdgpu_ras_mi300x.txt"))
    assert names(found) == ["amdgpu uncorrectable error", "amdgpu hardware error"]


def test_amdgpu_page_fault_is_application():
    found = kernel_log.classify(lines("kmsg_amdgpu_gfxhub_page_fault.txt"))
    assert names(found) == ["amdgpu page fault"]
    assert not found[0].hardware


def test_nvidia_xid_13_application_and_109_unlisted():
    found = kernel_log.classify(lines("kmsg_nvidia_xid_13_109.txt"))
    assert [m.name.split(" (")[0] for m in found] == ["NVIDIA XID 13"] * 3 + ["NVIDIA XID 109"]
    assert not any(m.hardware for m in found)


def test_nvidia_xid_79_and_fallen_off_bus_are_hardware():
    found = kernel_log.classify(
        lines("kmsg_nvidia_xid_79.txt") + lines("kmsg_nvidia_fallen_off_bus.txt")
    )
    assert names(found) == [
        "NVIDIA XID 79 (GPU has fallen off the bus)",
        "NVIDIA GPU fallen off the bus",
    ]
    assert all(m.hardware for m in found)


def test_mce_once_per_event_and_edac_ce_ignored():
    assert names(kernel_log.classify(lines("kmsg_mce.txt"))) == ["machine check"]
    assert kernel_log.classify(lines("kmsg_edac_ce.txt")) == []


def test_dmesg_json_parser_on_util_linux_output():
    entries = kernel_log.parse_dmesg_json((FIX / "dmesg_json_util_linux.json").read_text())
    assert entries[0] == (0.0, "example[0]")
    assert entries[-1][1] == "example[105]" and len(entries) == 106
    assert kernel_log.classify(m for _, m in entries) == []


def test_a_healthy_h200_boot_with_the_nvidia_driver_is_not_an_error(tmp_path):
    # The whole boot of a real H200 machine: the driver's load lines and its
    # "FBHUB Interrupt detected. Clearing it." notice are not faults.
    raw = (FIX / "dmesg_json_h200_firecracker_boot.json").read_text()
    entries = kernel_log.parse_dmesg_json(raw)
    assert len(entries) == 357
    assert any(m.startswith("NVRM: loading NVIDIA UNIX Open Kernel Module") for _, m in entries)
    assert kernel_log.classify(m for _, m in entries) == []
    found = kernel_log.probe(ctx(tree(tmp_path, uptime=3.6),
                                 Runner(dmesg=ToolOutput(0, raw, ""))))
    assert found.status == "ok", found


def test_dmesg_json_parser_rejects_garbage():
    with pytest.raises(ValueError):
        kernel_log.parse_dmesg_json("dmesg: unrecognized option '--json'")
    with pytest.raises(ValueError):
        kernel_log.parse_dmesg_json('{"other": []}')


# -- the probe on a fake tree and runner ------------------------------------


def dmesg_out(entries: list[tuple[float, str]]) -> str:
    return json.dumps({"dmesg": [{"pri": 3, "time": t, "msg": m} for t, m in entries]})


class Runner:
    """Answers per tool name: a ToolOutput, or an exception to raise."""

    def __init__(self, **answers):
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv, timeout_s):
        self.calls.append(list(argv))
        answer = self.answers.get(argv[0])
        if answer is None:
            raise ToolUnavailable(f"{argv[0]}: not installed")
        if isinstance(answer, Exception):
            raise answer
        return answer


def tree(tmp_path: Path, uptime: float = 1000.0, boot: str = "b1") -> Path:
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/uptime").write_text(f"{uptime} 5.0\n")
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    return tmp_path


def ctx(root: Path, runner: Runner, state: dict | None = None, **options) -> ProbeContext:
    return ProbeContext(
        root=root, run=runner, state={} if state is None else state, options=options
    )


XID79 = lines("kmsg_nvidia_xid_79.txt")[0]
RING = lines("kmsg_amdgpu_ring_timeout_reset.txt")[2]


def test_ok_when_nothing_new(tmp_path):
    run = Runner(dmesg=ToolOutput(0, dmesg_out([(10.0, "hello")]), ""))
    assert kernel_log.probe(ctx(tree(tmp_path), run)).status == "ok"


def test_failed_names_first_line_and_count(tmp_path):
    out = dmesg_out([(900.0, XID79), (950.0, RING), (960.0, "benign")])
    found = kernel_log.probe(ctx(tree(tmp_path), Runner(dmesg=ToolOutput(0, out, ""))))
    assert found.status == "failed"
    assert "2 kernel error line(s)" in found.detail and "XID 79" in found.detail
    assert "fallen off the bus" in found.detail and "amdgpu ring timeout x1" in found.detail


def test_first_run_looks_back_only_the_window(tmp_path):
    out = dmesg_out([(100.0, XID79), (700.0, "benign")])  # uptime 1000, window 600: from 400
    assert (
        kernel_log.probe(ctx(tree(tmp_path), Runner(dmesg=ToolOutput(0, out, "")))).status == "ok"
    )
    found = kernel_log.probe(
        ctx(tree(tmp_path / "b"), Runner(dmesg=ToolOutput(0, out, "")), lookback_s=1000)
    )
    assert found.status == "failed"


def test_cursor_second_run_sees_only_new_lines(tmp_path):
    root, state = tree(tmp_path), {}
    first = Runner(dmesg=ToolOutput(0, dmesg_out([(900.0, XID79)]), ""))
    assert kernel_log.probe(ctx(root, first, state)).status == "failed"
    again = Runner(dmesg=ToolOutput(0, dmesg_out([(900.0, XID79), (950.0, "benign")]), ""))
    assert kernel_log.probe(ctx(root, again, state)) == Finding(
        "ok", "no kernel errors since the last probe"
    )
    later = Runner(
        dmesg=ToolOutput(0, dmesg_out([(900.0, XID79), (950.0, "benign"), (990.0, RING)]), "")
    )
    found = kernel_log.probe(ctx(root, later, state))
    assert found.status == "failed" and "XID" not in found.detail and "ring timeout" in found.detail


def test_reboot_resets_the_cursor(tmp_path):
    state: dict = {"kernel_log": {"source": "dmesg", "boot": "old", "time": 5000.0}}
    run = Runner(dmesg=ToolOutput(0, dmesg_out([(900.0, XID79)]), ""))
    assert kernel_log.probe(ctx(tree(tmp_path), run, state)).status == "failed"


def test_application_errors_named_but_not_failing(tmp_path):
    out = dmesg_out([(900.0, m) for m in lines("kmsg_nvidia_xid_13_109.txt")])
    found = kernel_log.probe(ctx(tree(tmp_path), Runner(dmesg=ToolOutput(0, out, ""))))
    assert found.status == "ok" and "NVIDIA XID 13 (graphics engine exception) x3" in found.detail
    strict = kernel_log.probe(
        ctx(tree(tmp_path / "s"), Runner(dmesg=ToolOutput(0, out, "")), fail_on_application=True)
    )
    assert strict.status == "failed"


def test_dmesg_not_permitted_falls_back_to_journal(tmp_path):
    denied = ToolOutput(1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")
    journal = "\n".join(
        json.dumps({"__CURSOR": f"s=abc;i={i}", "MESSAGE": m})
        for i, m in enumerate(["benign", XID79])
    )
    run = Runner(dmesg=denied, journalctl=ToolOutput(0, journal + "\n", ""))
    state: dict = {}
    assert kernel_log.probe(ctx(tree(tmp_path), run, state)).status == "failed"
    assert run.calls[1][-2:] == ["--since", "-600s"]
    assert state["kernel_log"] == {"source": "journal", "cursor": "s=abc;i=1"}
    run2 = Runner(dmesg=denied, journalctl=ToolOutput(0, "", ""))
    assert kernel_log.probe(ctx(tree(tmp_path / "2"), run2, state)).status == "ok"
    assert run2.calls[1][-2:] == ["--after-cursor", "s=abc;i=1"]


def test_journal_message_as_bytes():
    text = json.dumps(
        {"__CURSOR": "c", "MESSAGE": list(b"mce: [Hardware Error]: Machine check events logged")}
    )
    assert kernel_log.parse_journal_json(text) == [
        ("c", "mce: [Hardware Error]: Machine check events logged")
    ]


def test_both_unavailable_is_unknown_with_reasons(tmp_path):
    denied = ToolOutput(1, "", "dmesg: read kernel buffer failed: Operation not permitted\n")
    found = kernel_log.probe(ctx(tree(tmp_path), Runner(dmesg=denied)))
    assert found.status == "unknown"
    assert "Operation not permitted" in found.detail and "journalctl: not installed" in found.detail


def test_timeout_and_garbage_are_unknown(tmp_path):
    slow = Runner(
        dmesg=ToolUnavailable("dmesg: no answer within 30 s"),
        journalctl=ToolUnavailable("journalctl: no answer within 30 s"),
    )
    assert kernel_log.probe(ctx(tree(tmp_path), slow)).status == "unknown"
    garbage = Runner(
        dmesg=ToolOutput(0, "<<not json>>", ""), journalctl=ToolOutput(0, "{oops\n", "")
    )
    found = kernel_log.probe(ctx(tree(tmp_path / "g"), garbage))
    assert found.status == "unknown" and "unparseable" in found.detail


def test_no_journal_files_is_unavailable(tmp_path):
    run = Runner(journalctl=ToolOutput(0, "", "No journal files were found.\n"))
    found = kernel_log.probe(ctx(tree(tmp_path), run))
    assert found.status == "unknown" and "No journal files" in found.detail


def test_on_this_machine():
    state: dict = {}
    for _ in range(2):
        found = kernel_log.probe(ProbeContext(state=state))
        assert found.status != "failed", found
