"""XGMI throughput in the agent's GPU source: two amd-smi readings make a rate.

The GPU source gets a probe double (as tests/lens/test_lens_sampler.py does)
and an XGMI runner double that replays the recorded 8x MI300X output, with a
fake clock; the last tests put a fake ``amd-smi`` script on PATH so the real
subprocess path, the older ``-m`` spelling and the real probe are exercised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from libs.events import GpuMetrics
from libs.gpu import GpuInventory, GpuSample, ProbeResult
from services.bench.node_sampler import AmdSmiXgmi, GpuSource, XgmiUnavailable

FIXTURES = Path(__file__).parent / "fixtures"
XGMI = FIXTURES / "amd_smi_xgmi_metric_mi300x8.json"
KB = 1024


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeProbe:
    def __init__(self, result: ProbeResult) -> None:
        self.result, self.calls = result, []

    def __call__(self, tools: tuple[str, ...], timeout_s: float, *, sysfs_root: object
                 ) -> ProbeResult:
        self.calls.append(tools)
        return self.result


class FakeXgmi:
    """Answers each call with the next text, or raises it if it is an exception."""

    def __init__(self, answers: list[str | Exception]) -> None:
        self.answers, self.calls = answers, 0

    def __call__(self, timeout_s: float) -> str:
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def inventory(tool: str) -> ProbeResult:
    gpus = tuple(GpuSample(index=i, pci_bus=None) for i in (0, 1, 2, 9))  # 9: not in xgmi
    return ProbeResult(status="ok", tool=tool, inventory=GpuInventory(tool=tool, gpus=gpus))


def recorded() -> str:
    return XGMI.read_text(encoding="utf-8")


def more_traffic(*, gpu: int, read_kb: int, write_kb: int) -> str:
    """The recording with extra KB on ``gpu``'s link to its next peer."""
    doc = json.loads(recorded())
    link = doc[gpu]["link_metrics"]["links"][(gpu + 1) % 8]
    link["read"]["value"] += read_kb
    link["write"]["value"] += write_kb
    return json.dumps(doc, indent=4)


def source(tool: str, xgmi: FakeXgmi, clock: Clock, tmp_path: Path) -> GpuSource:
    return GpuSource(probe=FakeProbe(inventory(tool)), sysfs_root=tmp_path, xgmi=xgmi,
                     clock=clock, retry_s=300)


def rates(gpus: list[GpuMetrics]) -> dict[int, tuple[float | None, float | None]]:
    return {g.index: (g.xgmi_rx_bytes_s, g.xgmi_tx_bytes_s) for g in gpus}


def test_the_first_reading_has_no_rate_the_second_has_bytes_per_second(tmp_path: Path) -> None:
    clock = Clock()
    xgmi = FakeXgmi([recorded(), more_traffic(gpu=0, read_kb=4096, write_kb=2048)])
    gpus = source("amd-smi", xgmi, clock, tmp_path)

    _, first = gpus.read()
    assert all(g.xgmi_rx_bytes_s is None and g.xgmi_tx_bytes_s is None for g in first)

    clock.t += 2.0
    tool, second = gpus.read()

    assert tool == "amd-smi" and xgmi.calls == 2
    assert rates(second) == {
        0: (4096 * KB / 2.0, 2048 * KB / 2.0),
        1: (0.0, 0.0),
        2: (0.0, 0.0),
        9: (None, None),  # amd-smi metric knows GPU 9, xgmi does not
    }


def test_a_counter_reset_gives_no_rate_then_rates_resume(tmp_path: Path) -> None:
    clock = Clock()
    busy = more_traffic(gpu=1, read_kb=10_000, write_kb=10_000)
    busier = more_traffic(gpu=1, read_kb=10_500, write_kb=10_100)
    xgmi = FakeXgmi([busy, recorded(), busier])  # the middle one: driver reloaded
    gpus = source("amd-smi", xgmi, clock, tmp_path)

    gpus.read()
    clock.t += 1.0
    after_reset = rates(gpus.read()[1])
    clock.t += 1.0
    resumed = rates(gpus.read()[1])

    assert after_reset[1] == (None, None)
    assert after_reset[0] == (0.0, 0.0)  # GPU 0's counters did not go back
    assert resumed[1] == (10_500 * KB, 10_100 * KB)


def test_xgmi_is_only_asked_of_amd_smi(tmp_path: Path) -> None:
    xgmi = FakeXgmi([recorded()])
    gpus = source("rocm-smi", xgmi, Clock(), tmp_path)

    for _ in range(3):
        tool, read = gpus.read()
        assert tool == "rocm-smi" and len(read) == 4

    assert xgmi.calls == 0
    assert all(g.xgmi_rx_bytes_s is None for g in read)


@pytest.mark.parametrize(
    "failure",
    [
        XgmiUnavailable("`amd-smi xgmi --metric --json` exited with 2: Not supported"),
        "Xgmi metric is not supported on this device\n",  # exit 0, not JSON
        json.dumps([{"gpu": 0, "bdf": "0000:08:00.0", "link_metrics": {"links": [
            {"gpu": 0, "read": "N/A", "write": "N/A"}]}}]),  # a Navi box: no XGMI links
    ],
    ids=["non-zero-exit", "not-supported-text", "no-links"],
)
def test_unsupported_xgmi_is_not_retried_every_tick(
    tmp_path: Path, failure: str | Exception
) -> None:
    clock = Clock()
    xgmi = FakeXgmi([failure, recorded(), more_traffic(gpu=2, read_kb=300, write_kb=0)])
    gpus = source("amd-smi", xgmi, clock, tmp_path)

    for _ in range(100):  # a hundred ticks ask once
        tool, read = gpus.read()
        assert tool == "amd-smi" and len(read) == 4  # the GPUs are still reported
        clock.t += 1.0
    assert xgmi.calls == 1 and gpus.xgmi_reason

    clock.t += 300.0
    gpus.read()  # retried: a first reading again, so no rate yet
    clock.t += 3.0
    read = rates(gpus.read()[1])

    assert xgmi.calls == 3 and gpus.xgmi_reason is None
    assert read[2] == (100 * KB, 0.0)


def test_a_missing_amd_smi_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    gpus = GpuSource(probe=FakeProbe(inventory("amd-smi")), sysfs_root=tmp_path,
                     xgmi=AmdSmiXgmi(which=lambda _: None), clock=Clock())

    tool, read = gpus.read()

    assert tool == "amd-smi" and [g.index for g in read] == [0, 1, 2, 9]
    assert gpus.xgmi_reason == "amd-smi: not found on PATH"


def fake_amd_smi(bin_dir: Path, log: Path, xgmi_text: Path) -> None:
    """An amd-smi of an older release: `xgmi --metric` is unknown, `xgmi -m` works."""
    script = bin_dir / "amd-smi"
    script.write_text(
        f"""#!{sys.executable}
import sys
args = sys.argv[1:]
open({str(log)!r}, "a").write(" ".join(args) + "\\n")
if args[:1] == ["metric"]:
    sys.stdout.write(open({str(FIXTURES / "amd_smi_metric_rx6600.json")!r}).read())
elif args[:2] == ["xgmi", "-m"]:
    sys.stdout.write(open({str(xgmi_text)!r}).read())
elif args[:1] == ["xgmi"]:
    sys.stderr.write("amd-smi xgmi: error: unrecognized arguments: --metric\\n")
    sys.exit(2)
else:
    sys.exit(1)
""",
        encoding="utf-8",
    )
    script.chmod(0o755)


def test_a_real_amd_smi_run_through_the_real_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, log, xgmi_text = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "xgmi.json"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    fake_amd_smi(bin_dir, log, xgmi_text)
    xgmi_text.write_text(recorded(), encoding="utf-8")
    clock = Clock()
    gpus = GpuSource(sysfs_root=tmp_path, clock=clock, timeout_s=10.0)

    gpus.read()
    xgmi_text.write_text(more_traffic(gpu=0, read_kb=512, write_kb=256), encoding="utf-8")
    clock.t += 0.5
    tool, read = gpus.read()

    assert tool == "amd-smi" and [g.index for g in read] == [0]  # the RX 6600 metric output
    assert (read[0].xgmi_rx_bytes_s, read[0].xgmi_tx_bytes_s) == (512 * KB / 0.5, 256 * KB / 0.5)
    xgmi_calls = [line for line in log.read_text().splitlines() if line.startswith("xgmi")]
    # `--metric` failed once; the `-m` spelling that worked is the only one run after.
    assert xgmi_calls == ["xgmi --metric --json", "xgmi -m --json", "xgmi -m --json"]
