"""bench/control_plane.py's own logic: what a burst holds (a killed node
sends nothing), unique telemetry ids, and the largest size each service
kept up with."""

from __future__ import annotations

import re
from typing import Any

from tests.helpers import load_bench

cp = load_bench("control_plane")


def _subjects(frames: bytes) -> list[str]:
    return [s.decode() for s in re.findall(rb"^HPUB (\S+) ", frames, flags=re.M)]


def test_a_burst_holds_its_nodes_beat_and_telemetry_and_nothing_of_the_killed() -> None:
    fleet = cp.Fleet.make(45)
    beats, telemetry = fleet.burst(second=3, part=2, due=1_800_000_000.0)
    mine = [f"sim-{i:05d}" for i in range(2, 45, cp.SLICES)]
    assert _subjects(beats) == [f"safe.live.{n}.heartbeat" for n in mine]
    assert _subjects(telemetry) == [f"safe.telemetry.node.{n}" for n in mine]
    ids = re.findall(rb"Nats-Msg-Id: (\S+)\r\n", telemetry)
    assert len(set(ids)) == len(mine) and all(len(i) == 32 for i in ids)
    assert b"2027-01-15T08:00:00" in telemetry  # stamped with the burst's due time

    fleet.killed.add(22)
    beats, telemetry = fleet.burst(second=4, part=2, due=1_800_000_001.0)
    assert "safe.live.sim-00022.heartbeat" not in _subjects(beats)
    assert "safe.telemetry.node.sim-00022" not in _subjects(telemetry)
    assert len(_subjects(beats)) == len(mine) - 1


def _run(nodes: int, lags: dict[str, tuple[str, float]], judge_late_s: float = 0.05
         ) -> dict[str, Any]:
    return {"nodes": nodes,
            "consumers": {name: {"service": svc, "lag_p99_s": lag}
                          for name, (svc, lag) in lags.items()},
            "detection": {"killed": 40, "detected": 40, "after_deadline_p99_s": judge_late_s},
            "goals": {"no_wrong_faults": True}}


def test_a_service_keeps_up_to_the_largest_size_before_its_first_miss() -> None:
    runs = [
        _run(5000, {"lens-telemetry": ("lens-collector", 0.9), "failover": ("failover", 0.0)}),
        _run(12500, {"lens-telemetry": ("lens-collector", 1.6), "failover": ("failover", 0.1)},
             judge_late_s=0.6),
        _run(20000, {"lens-telemetry": ("lens-collector", 9.0), "failover": ("failover", 0.1)}),
    ]
    assert cp.keeps_up(runs) == {"lens-collector": 12500, "failover": 5000}
    assert cp.keeps_up(runs[1:]) == {"lens-collector": 12500, "failover": 0}
    assert cp.pct([3.0, 1.0, 2.0], 0.5) == 2.0 and cp.pct([], 0.99) == 0.0


def test_a_durable_is_named_after_the_service_whose_route_table_declares_it() -> None:
    assert cp.service_of("lens-telemetry") == "lens-collector"
    assert cp.service_of("failover-steps") == "failover"
    assert cp.service_of("bench-agent-jobs-gpu-07") == "bench-agent"  # one per node
    assert cp.service_of("bench-coordinator") == "bench-coordinator"
    assert cp.service_of("someone-elses") == "someone-elses"


def test_clickhouse_growth_is_the_rows_added_at_each_tables_bytes_per_row() -> None:
    before = {"gpu_metrics": (1000, 9000), "events": (10, 5000)}
    after = {"gpu_metrics": (3000, 15000), "events": (10, 4000), "logs": (50, 500)}
    # 2,000 GPU rows at 5 bytes each, no new event, 50 log rows at 10 bytes
    assert cp.stored_bytes(before, after) == 2000 * 5 + 50 * 10
