"""Alert rules as scenarios: readings with timestamps in, transitions out.
The engine is pure, so each scenario is a list of (time, feed) steps and
the alerts expected to open and close along the way."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from services.lens_collector.alerts import (
    AlertConfig,
    AlertEngine,
    GpuReading,
    JobReading,
    ThresholdRule,
    Transition,
)

Step = tuple[float, Callable[[AlertEngine, float], list[Transition]]]


def gpu(temp: float | None = None, vram: float | None = None, power: float | None = None,
        node: str = "n1", index: int = 0) -> Callable[[AlertEngine, float], list[Transition]]:
    return lambda e, t: e.gpu_window(t, {(node, index): GpuReading(temp, vram, power)})


def quiet_gpus(e: AlertEngine, t: float) -> list[Transition]:
    return e.gpu_window(t, {})


def job(**reading: object) -> Callable[[AlertEngine, float], list[Transition]]:
    return lambda e, t: e.job_window(t, {"j1": JobReading(**reading)})  # type: ignore[arg-type]


def tick(e: AlertEngine, t: float) -> list[Transition]:
    return e.tick(t)


def run(steps: list[Step], config: AlertConfig | None = None) -> list[tuple[float, str, str]]:
    engine = AlertEngine(config)
    seen = []
    for at, feed in steps:
        seen += [(at, t.rule, t.state) for t in feed(engine, at)]
    return seen


def every(start: float, stop: float, step: float, feed) -> list[Step]:  # type: ignore[no-untyped-def]
    out = []
    t = start
    while t <= stop:
        out.append((t, feed))
        t += step
    return out


def test_gpu_temperature_opens_after_ten_minutes_above_80_and_closes_with_hysteresis() -> None:
    steps = (every(0, 595, 5, gpu(temp=85))  # 595 s above: not yet
             + [(600, gpu(temp=85))]  # 600 s: opens
             + every(605, 700, 5, gpu(temp=78))  # below 80 but above 75: stays open
             + every(705, 760, 5, gpu(temp=70))  # below 75 for 60 s: closes at 765
             + [(765, gpu(temp=70))])
    assert run(steps) == [(600, "gpu_temp_high", "open"), (765, "gpu_temp_high", "closed")]


def test_a_breach_that_does_not_last_never_opens() -> None:
    steps = every(0, 500, 5, gpu(temp=85)) + [(505, quiet_gpus)] + every(510, 1000, 5,
                                                                        gpu(temp=85))
    # The dip at 505 s (left out = below the clear level) restarts the clock:
    # 510..1000 s is 490 s, short of ten minutes.
    assert run(steps) == []


def test_vram_and_power_against_their_limits() -> None:
    config = AlertConfig(gpu_vram_frac=ThresholdRule(above=0.95, for_s=10, clear_below=0.9),
                         gpu_power_frac=ThresholdRule(above=0.95, for_s=0, clear_below=0.9))
    steps = [(0, gpu(vram=0.97, power=0.5)), (5, gpu(vram=0.97, power=0.99)),
             (10, gpu(vram=0.97, power=0.93)), (15, gpu(vram=0.8, power=0.8))]
    assert run(steps, config) == [(5, "gpu_power_high", "open"), (10, "gpu_vram_high", "open"),
                                  (15, "gpu_vram_high", "closed"),
                                  (15, "gpu_power_high", "closed")]


def test_gpus_are_separate_keys_and_ids_are_stable() -> None:
    engine = AlertEngine(AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=75)))
    opened = engine.gpu_window(0, {("n1", 0): GpuReading(90), ("n1", 1): GpuReading(60)})
    assert [(t.key, t.gpu, t.node) for t in opened] == [("n1/gpu0", 0, "n1")]
    closed = engine.gpu_window(5, {("n1", 0): GpuReading(70)})
    assert closed[0].alert_id == opened[0].alert_id and closed[0].state == "closed"
    assert engine.open_alerts() == []


def test_an_open_gpu_that_goes_silent_stays_open() -> None:
    steps = [(0, gpu(temp=90)), (5, quiet_gpus), (10, quiet_gpus)]
    assert run(steps, AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=75))) == [
        (0, "gpu_temp_high", "open")]


def test_job_hang_opens_after_no_iteration_for_n_seconds_and_closes_on_progress() -> None:
    config = AlertConfig(job_hang_s=60)
    steps = [(0, job(iteration=10)), (30, job(iteration=20)), (60, tick),
             (85, tick), (95, tick),  # 65 s since iteration 20
             (100, job(iteration=20)), (110, tick), (120, job(iteration=21))]
    assert run(steps, config) == [(95, "job_hang", "open"), (120, "job_hang", "closed")]


def test_nonfinite_loss_opens_at_once_and_closes_on_finite_losses() -> None:
    steps = [(0, job(iteration=1, finite_losses=4)),
             (5, job(iteration=2, nonfinite_losses=1, finite_losses=3)),
             (10, job(iteration=3, nonfinite_losses=2)),
             (15, job(iteration=4, finite_losses=4))]
    assert run(steps) == [(5, "loss_nonfinite", "open"), (15, "loss_nonfinite", "closed")]


def test_throughput_below_its_own_trailing_median() -> None:
    config = AlertConfig(throughput_for_s=10, throughput_clear_for_s=10, throughput_min_history=5)
    normal = [(t, job(iteration=t, throughput=100.0 + (t % 3))) for t in range(0, 50, 5)]
    slow = [(t, job(iteration=t, throughput=60.0)) for t in range(50, 70, 5)]
    back = [(t, job(iteration=t, throughput=99.0)) for t in range(70, 90, 5)]
    assert run(normal + slow + back, config) == [(60, "throughput_low", "open"),
                                                 (80, "throughput_low", "closed")]


def test_a_short_dip_in_throughput_does_not_alert() -> None:
    config = AlertConfig(throughput_for_s=10, throughput_min_history=5)
    steps = ([(t, job(iteration=t, throughput=100.0)) for t in range(0, 50, 5)]
             + [(50, job(iteration=50, throughput=50.0))]
             + [(t, job(iteration=t, throughput=100.0)) for t in range(55, 80, 5)])
    assert run(steps, config) == []


def test_checkpoint_older_than_n_seconds() -> None:
    config = AlertConfig(checkpoint_max_age_s=100, job_hang_s=1000)
    steps = [(0, job(iteration=1)), (50, job(iteration=2, last_checkpoint=40.0)),
             (130, tick), (141, tick), (150, job(iteration=3, last_checkpoint=145.0)),
             (200, tick)]
    assert run(steps, config) == [(141, "checkpoint_stale", "open"),
                                  (150, "checkpoint_stale", "closed")]


def test_a_job_without_any_checkpoint_is_stale_from_its_first_sample() -> None:
    config = AlertConfig(checkpoint_max_age_s=100, job_hang_s=1000)
    assert run([(0, job(iteration=1)), (99, tick), (101, tick)], config) == [
        (101, "checkpoint_stale", "open")]


def test_node_down_when_telemetry_stops_and_up_when_it_returns() -> None:
    config = AlertConfig(node_down_s=30)
    steps = [(0, lambda e, t: e.node_window(t, {"n1": 0.0, "n2": 0.0})),
             (20, lambda e, t: e.node_window(t, {"n1": 20.0})),
             (31, tick), (45, tick), (51, tick),
             (60, lambda e, t: e.node_window(t, {"n2": 58.0}))]
    got = run(steps, config)
    assert got == [(31, "node_down", "open"), (51, "node_down", "open"),
                   (60, "node_down", "closed")]


def test_a_finished_job_closes_its_alerts_and_is_forgotten() -> None:
    engine = AlertEngine(AlertConfig(job_hang_s=10, checkpoint_max_age_s=1000))
    engine.job_window(0, {"j1": JobReading(iteration=1, nonfinite_losses=1)})
    assert [t.rule for t in engine.tick(20)] == ["job_hang"]
    closed = engine.job_ended("j1", 25)
    assert sorted(t.rule for t in closed) == ["job_hang", "loss_nonfinite"]
    assert all(t.state == "closed" for t in closed)
    assert engine.tick(1000) == [] and engine.open_alerts() == []


def test_restored_alerts_are_not_opened_twice() -> None:
    first = AlertEngine(AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=75)))
    [opened] = first.gpu_window(0, {("n1", 0): GpuReading(90)})
    second = AlertEngine(first.config)
    assert second.restore([opened], 5) == []
    assert second.gpu_window(5, {("n1", 0): GpuReading(91)}) == []
    [closed] = second.gpu_window(10, {("n1", 0): GpuReading(60)})
    assert closed.alert_id == opened.alert_id and closed.state == "closed"


@pytest.mark.parametrize("bad", [{"throughput_ratio": 1.5}, {"job_hang_s": 0},
                                 {"unknown_rule": 1}])
def test_config_is_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AlertConfig.model_validate(bad)


def test_nan_readings_are_not_breaches() -> None:
    assert run([(0, gpu(temp=math.nan))],
               AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=75))) == []
