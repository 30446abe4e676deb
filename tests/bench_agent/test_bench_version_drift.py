"""Driver and ROCm/CUDA version drift against the fleet, decided over the
coordinator's records as data: which runs count, when a node has drifted,
and what the finding does to the verdict under each action."""

from __future__ import annotations

from libs.events import BenchCheck
from libs.records import BenchRecord, BenchRun
from services.bench.version_drift import (
    DriftFinding,
    find_drift,
    fleet_versions,
    stated_versions,
    with_finding,
)

NOW = 1_000_000.0
DAY = 86_400.0
MI300X = "AMD Instinct MI300X"


def run(node: str, versions: str, *, model: str = MI300X, level: str = "standard",
        age: float = 60.0, status: str = "ok") -> BenchRun:
    return BenchRun(node=node, time=NOW - age, event_id=f"{node}-{age}", level=level,
                    passed=True, device="rocm", device_count=8, gpu_model=model, duration_s=1.0,
                    checks=[BenchCheck(name="gemm_bf16_8192", status="ok"),
                            BenchCheck(name="driver_versions", status=status,  # type: ignore[arg-type]
                                       detail=versions)])


def records(*runs: BenchRun) -> dict[str, BenchRecord]:
    out: dict[str, BenchRecord] = {}
    for r in runs:
        out.setdefault(r.node, BenchRecord(node=r.node)).levels[r.level] = r
    return out


FLEET = records(*(run(f"n{i}", "amdgpu 6.10.5, rocm 6.3.1") for i in range(1, 7)),
                run("odd", "amdgpu 6.10.5, rocm 6.2.0; not read: nothing"),
                run("h100", "cuda 12.4, nvidia 550.90.07", model="NVIDIA H100 80GB HBM3"),
                run("stale", "amdgpu 6.8.5, rocm 6.1.0", age=8 * DAY),
                run("quick", "amdgpu 6.8.5, rocm 6.1.0", level="quick"),
                run("unread", "no GPU driver loaded", status="skipped"))


def fleet() -> dict[str, dict[str, str]]:
    return fleet_versions(FLEET, gpu_model=MI300X, levels=("standard", "full"), now=NOW,
                          max_age_s=7 * DAY)


def finding(node: str, *, action: str = "report", min_peers: int = 3) -> DriftFinding | None:
    versions = stated_versions(FLEET[node].levels["standard"].checks)
    return find_drift(node, versions, fleet(), fault="driver_drift", severity="warning",
                      action=action, min_peers=min_peers)


def test_the_fleet_is_the_recent_judged_runs_of_the_same_gpu_model() -> None:
    versions = fleet()
    assert sorted(versions) == ["n1", "n2", "n3", "n4", "n5", "n6", "odd"]
    assert versions["odd"] == {"amdgpu": "6.10.5", "rocm": "6.2.0"}


def test_a_node_apart_from_the_majority_of_its_model_is_found() -> None:
    found = finding("odd")
    assert found is not None
    assert found.drifted == ("rocm 6.2.0, fleet majority 6.3.1 (6 of 7 nodes)",)
    assert found.detail == "driver_drift (warning): rocm 6.2.0, fleet majority 6.3.1 (6 of 7 nodes)"
    assert finding("n3") is None
    assert finding("odd", min_peers=7) is None  # six peers: too few to call a majority
    # A node that states nothing, or a model nobody else runs, has nothing to drift from.
    assert find_drift("x", {}, fleet(), fault="driver_drift", severity="warning",
                      action="report", min_peers=3) is None


def test_report_keeps_the_outcome_and_quarantine_fails_the_verdict() -> None:
    found = finding("odd")
    checks = [BenchCheck(name="gemm_bf16_8192", status="ok")]
    outcome, reason, out = with_finding("healthy", "within the fleet (node score +0.1%)",
                                        checks, found)
    assert outcome == "healthy"
    assert reason == ("within the fleet (node score +0.1%); driver_drift (warning): rocm 6.2.0, "
                      "fleet majority 6.3.1 (6 of 7 nodes)")
    assert out[-1].name == "driver_drift" and out[-1].status == "failed"
    assert out[-1].detail.endswith("(reported)")
    assert with_finding("degraded", "slow", checks, None) == ("degraded", "slow", checks)

    strict = finding("odd", action="quarantine")
    outcome, reason, out = with_finding("healthy", "within the fleet", checks, strict)
    assert outcome == "failed" and reason.startswith("driver_drift (warning): rocm 6.2.0")
    assert out[-1].detail.endswith("(quarantines the node)")
    outcome, reason, _ = with_finding("degraded", "gemm 30% below", checks, strict)
    assert outcome == "failed" and reason.endswith("; gemm 30% below")
