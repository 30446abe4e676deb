"""Driver and ROCm/CUDA version drift against the fleet (pure).

A node's standard and full runs state the versions it runs (the
``driver_versions`` check, ``health.versions.version_check``); the
coordinator keeps every node's latest run, so it can hold one node against
the others of its GPU model. A node that runs another amdgpu driver, ROCm,
NVIDIA driver or CUDA than their strict majority gets a finding of the
catalogue's ``driver_versions`` entry: fault ``driver_drift``, its severity
(warning) and action (report), or what the configuration's
``driver_versions`` probe sets them to.

What the finding does to the coordinator's verdict follows the action, as a
probe's failing streak does on the agent: ``quarantine`` fails the verdict;
``report`` leaves its outcome, and the finding rides along in the verdict's
checks (a ``driver_drift`` check, "failed") and its reason, and in the
coordinator's log and metrics, for the operator to act on. Nothing here does
I/O; ``BenchCoordinator.publish_verdict`` applies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from libs.events import BenchCheck
from libs.records import BenchRecord
from services.bench.fleet import Outcome
from services.bench.health.versions import PROBE, drift, parse_stated

CHECK = PROBE.kind  # the run's check that states the versions
FINDING = "driver_drift"  # the verdict's check that names a drift
# Only a strict majority is one to drift from: a rollout half done is not a fault.
MAJORITY = 0.5


@dataclass(frozen=True)
class DriftFinding:
    fault: str
    severity: str
    action: str  # quarantine | report
    drifted: tuple[str, ...]  # one phrase per component

    @property
    def detail(self) -> str:
        return f"{self.fault} ({self.severity}): {'; '.join(self.drifted)}"


def stated_versions(checks: Iterable[BenchCheck]) -> dict[str, str]:
    """The versions a run states ({} when its versions check is missing or skipped)."""
    for check in checks:
        if check.name == CHECK and check.status == "ok":
            return parse_stated(check.detail)
    return {}


def fleet_versions(records: Mapping[str, BenchRecord], *, gpu_model: str, levels: Iterable[str],
                   now: float, max_age_s: float) -> dict[str, dict[str, str]]:
    """Node -> the versions its latest run of ``levels`` states, over the
    nodes of ``gpu_model`` whose run is at most ``max_age_s`` old."""
    wanted = set(levels)
    out: dict[str, dict[str, str]] = {}
    for node, record in records.items():
        runs = [r for lvl, r in record.levels.items() if lvl in wanted
                and (r.gpu_model or r.device) == gpu_model and now - r.time <= max_age_s]
        if not runs:
            continue
        versions = stated_versions(max(runs, key=lambda r: r.time).checks)
        if versions:
            out[node] = versions
    return out


def find_drift(node: str, mine: Mapping[str, str], fleet: Mapping[str, Mapping[str, str]], *,
               fault: str, severity: str, action: str, min_peers: int) -> DriftFinding | None:
    """What ``node`` runs apart from its fleet's majority (the node counted
    in it), or None: nothing stated, fewer than ``min_peers`` peers stating
    theirs (too few to call a majority, as for figures), or no drift."""
    peers = [v for n, v in sorted(fleet.items()) if n != node and v]
    if not mine or len(peers) < min_peers:
        return None
    drifted = drift(mine, [*peers, mine], min_share=MAJORITY)
    return DriftFinding(fault, severity, action, tuple(drifted)) if drifted else None


def with_finding(outcome: Outcome, reason: str, checks: list[BenchCheck],
                 finding: DriftFinding | None) -> tuple[Outcome, str, list[BenchCheck]]:
    """A verdict (outcome, reason, checks) with the finding applied."""
    if finding is None:
        return outcome, reason, checks
    acted = "quarantines the node" if finding.action == "quarantine" else "reported"
    check = BenchCheck(name=FINDING, status="failed", detail=f"{finding.detail} ({acted})")
    if finding.action == "quarantine":
        why = finding.detail if outcome == "healthy" else f"{finding.detail}; {reason}"
        return "failed", why, [*checks, check]
    return outcome, f"{reason}; {finding.detail}", [*checks, check]
