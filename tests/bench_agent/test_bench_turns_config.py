"""Turn-taking on shared hardware, the bench configuration file (reload on
change, refusal of a bad file), and the timing of a kernel with its
run-queue correction, all with injected clocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libs.settings import Settings
from services.bench.config import BenchConfig, ConfigFile
from services.bench.measure import percentile, time_kernel
from services.bench.turns import TurnRing


def test_turns_go_round_the_ring_one_node_at_a_time() -> None:
    ring = TurnRing.of(["a", "b", "c"])
    assert ring.acquire("b", 0) == ["b"]
    assert ring.acquire("a", 0) == [] and ring.acquire("c", 0) == []
    assert ring.release("b", 1) == ["c"]  # after b comes c, not a
    assert ring.acquire("b", 1) == []
    assert ring.release("c", 2) == ["a"]
    assert ring.release("a", 3) == ["b"]
    assert ring.leave("b", 4) == []  # nobody else waiting
    assert ring.acquire("a", 5) == ["a"] and ring.acquire("a", 5) == ["a"]  # asked twice
    assert ring.turns == 5


def test_a_stuck_holder_loses_the_turn_and_its_late_release_is_ignored() -> None:
    ring = TurnRing.of(["a", "b"], max_hold_s=10)
    ring.acquire("a", 0)
    ring.acquire("b", 1)
    assert ring.expire(5) == []
    assert ring.expire(11) == ["b"]
    assert ring.release("a", 12) == [] and ring.holder == "b"


def test_leaving_while_waiting_frees_the_queue() -> None:
    ring = TurnRing.of(["a", "b", "c"])
    ring.acquire("a", 0)
    ring.acquire("b", 0)
    ring.leave("b", 1)
    ring.acquire("c", 1)
    assert ring.release("a", 2) == ["c"]


def write(path: Path, text: str, mtime: float) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def test_config_file_reloads_on_change_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    write(path, "probes:\n  - {name: t, kind: gpu_temperature, interval_s: 30}\n", 1000)
    config = ConfigFile(path)
    assert [c.interval_s for c in config.current.probes] == [30]
    assert config.reload() is False  # unchanged
    write(path, "probes:\n  - {name: t, kind: gpu_temprature}\n", 2000)
    assert config.reload() is False
    assert config.error is not None and "line 2" in config.error and "kind" in config.error
    assert [c.interval_s for c in config.current.probes] == [30]  # still in force
    write(path, "probes: []\nfleet: {node_drop: 0.08}\n", 3000)
    assert config.reload() is True and config.error is None
    assert config.current.probes == [] and config.current.fleet.node_drop == 0.08
    path.unlink()
    assert config.reload() is False and "cannot read" in (config.error or "")


def test_config_from_the_environment_and_defaults(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIMUS_BENCH_CONFIG", raising=False)
    assert ConfigFile().current == BenchConfig() and ConfigFile().path is None
    path = tmp_path / "b.yaml"
    path.write_text("floors:\n  MI300X: {gemm_bf16_8192_tflops: 500}\n")
    monkeypatch.setenv("PRIMUS_BENCH_CONFIG", str(path))
    config = ConfigFile(Settings().bench_config).current  # as the agent and coordinator do
    assert config.floors_for("AMD Instinct MI300X") == {"gemm_bf16_8192_tflops": 500}
    assert config.floors_for("cpu") == {}


def test_probe_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="repeated: a"):
        BenchConfig.model_validate({"probes": [{"name": "a", "kind": "gemm"},
                                               {"name": "a", "kind": "gpu_ecc"}]})


class FakeTime:
    """A wall clock and a run-queue counter the test advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queued = 0.0

    def clock(self) -> float:
        return self.now

    def delay(self) -> float:
        return self.queued


def test_time_kernel_subtracts_time_spent_waiting_for_a_core() -> None:
    t = FakeTime()
    calls = []

    def kernel() -> None:  # 10 ms of work, plus 10 ms queued behind a neighbour each call
        calls.append(t.now)
        t.now += 0.020
        t.queued += 0.010

    timing = time_kernel(kernel, repeats=3, sample_s=0.095, warmup=2, clock=t.clock,
                         queue_delay=t.delay)
    assert timing.seconds == pytest.approx(0.010)
    assert len(timing.samples) == 3 and timing.calls == 15 and len(calls) == 17
    plain = time_kernel(kernel, repeats=1, sample_s=0.1, clock=t.clock, queue_delay=None)
    assert plain.seconds == pytest.approx(0.020)


def test_time_kernel_on_a_gpu_syncs_once_per_sample_and_passes_turns() -> None:
    t = FakeTime()
    syncs, turns = [], []

    def launch() -> None:
        t.now += 0.001  # asynchronous: the sync waits for the device

    def sync() -> None:
        syncs.append(t.now)
        t.now += 0.0

    timing = time_kernel(launch, repeats=4, sample_s=0.01, warmup=5, sync=sync, clock=t.clock,
                         queue_delay=None, between=lambda: turns.append(t.now))
    assert timing.seconds == pytest.approx(0.001)
    assert len(syncs) == 1 + 4 and len(turns) == 4
    assert timing.calls == 4 * 10


def test_percentile() -> None:
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile([1, 2], 0.25) == 1.25
    with pytest.raises(ValueError):
        percentile([], 0.5)


def test_the_shipped_example_config_is_valid() -> None:
    path = Path(__file__).parents[2] / "services" / "bench" / "bench-config.example.yaml"
    config = ConfigFile(path)
    assert config.error is None, config.error
    assert [c.kind for c in config.current.probes] == ["gpu_temperature", "gpu_ecc", "gpu_count"]
    assert config.current.floors_for("AMD Instinct MI300X")["gemm_bf16_8192_tflops"] == 500
    assert config.current.standard == BenchConfig().standard  # the example shows the defaults
