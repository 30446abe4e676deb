"""Verdicts as scenarios: a node's run against its fleet and floors, the
decision to retry, and what a retry confirms."""

from __future__ import annotations

import math
import random

import pytest

from services.bench.config import FleetPolicy
from services.bench.fleet import judge_node
from services.bench.triage import Candidate, choose_partner, decide, group_passed, rendezvous_port
from services.bench.verdict import confirm, judge_checks, training_checks

POLICY = FleetPolicy()
UNITS = {"gemm_tflops": "TFLOPS", "triad_gbps": "GB/s", "train_tokens_per_s": "tokens/s",
         "allreduce_gbps": "GB/s", "step_ms": "ms"}
BASE = {"gemm_tflops": 100.0, "triad_gbps": 50.0, "train_tokens_per_s": 3000.0,
        "allreduce_gbps": 20.0, "step_ms": 10.0}


def run(scale: float = 1.0, **override: float) -> list[tuple[str, float, str]]:
    values = {k: v * scale for k, v in BASE.items()} | override
    return [(k, v, UNITS[k]) for k, v in values.items()]


def peers(n: int, noise: float, seed: int = 1) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    return {f"p{i}": {k: v * (1 + rng.gauss(0, noise)) for k, v in BASE.items()}
            for i in range(n)}


def test_a_uniformly_slow_node_is_caught_by_its_score_not_by_any_one_figure() -> None:
    judged = judge_node(run(0.90), peers(7, 0.01), policy=POLICY)
    assert judged.outcome == "degraded"
    assert judged.flagged == ["node_score"]  # each figure alone is within figure_drop
    assert judged.score is not None and judged.score_median is not None
    assert judged.score / judged.score_median == pytest.approx(0.90, abs=0.01)
    assert "node score -10" in judged.reason


def test_noise_within_the_fleet_is_healthy() -> None:
    for seed in range(20):
        mine = [(k, v, UNITS[k]) for k, v in peers(1, 0.01, seed=100 + seed)["p0"].items()]
        judged = judge_node(mine, peers(7, 0.01, seed=seed), policy=POLICY)
        assert judged.outcome == "healthy", judged.reason


def test_one_broken_figure_is_degraded_and_a_collapse_is_failed() -> None:
    slow_link = judge_node(run(allreduce_gbps=14.0), peers(7, 0.01), policy=POLICY)
    assert slow_link.outcome == "degraded" and "allreduce_gbps" in slow_link.flagged
    collapsed = judge_node(run(gemm_tflops=30.0), peers(7, 0.01), policy=POLICY)
    assert collapsed.outcome == "failed" and "70% below the fleet median" in collapsed.reason


def test_noisy_figures_weigh_little_in_the_score() -> None:
    noisy = peers(7, 0.01)
    rng = random.Random(3)
    for values in noisy.values():
        values["allreduce_gbps"] = 20.0 * (1 + rng.gauss(0, 0.25))
    # A node whose only weak figure is the noisy one stays healthy...
    assert judge_node(run(allreduce_gbps=17.0), noisy, policy=POLICY).outcome == "healthy"
    # ...while a 10% drop of everything still shows.
    assert judge_node(run(0.9), noisy, policy=POLICY).outcome == "degraded"


def test_floors_fail_a_node_even_when_the_whole_fleet_is_slow() -> None:
    judged = judge_node(run(0.5), peers(7, 0.01), policy=POLICY,
                        floors={"gemm_tflops": 80.0})
    assert judged.outcome == "failed" and "below the floor 80" in judged.reason
    nan = judge_node(run(gemm_tflops=math.nan), {}, policy=POLICY, floors={"gemm_tflops": 1})
    assert nan.outcome == "failed"


def test_too_few_peers_abstain_and_lower_is_better_figures_are_not_judged() -> None:
    judged = judge_node(run(0.5), peers(2, 0.01), policy=POLICY)
    assert judged.outcome == "healthy" and "too few peers" in judged.reason
    judged = judge_node(run(step_ms=100.0), peers(7, 0.01), policy=POLICY)
    assert judged.outcome == "healthy"


SCENARIOS = [
    # local, fleet, first run (None: this is the first) -> action, outcome
    (("healthy", ""), ("healthy", "ok"), None, "verdict", "healthy"),
    (("healthy", ""), ("degraded", "slow"), None, "retry", "degraded"),
    (("healthy", ""), ("failed", "collapsed"), None, "retry", "failed"),
    (("failed", "NaN twice"), ("healthy", "ok"), None, "verdict", "failed"),
    (("healthy", ""), ("degraded", "slow"), ("degraded", "slow"), "verdict", "degraded"),
    (("healthy", ""), ("failed", "x"), ("failed", "x"), "verdict", "failed"),
    (("healthy", ""), ("failed", "x"), ("degraded", "y"), "verdict", "degraded"),
    (("healthy", ""), ("healthy", "ok"), ("failed", "x"), "verdict", "healthy"),
]


@pytest.mark.parametrize(("local", "fleet", "first", "action", "outcome"), SCENARIOS)
def test_decide(local, fleet, first, action, outcome) -> None:  # type: ignore[no-untyped-def]
    decision = decide(local=local, fleet=fleet, first=first)
    assert (decision.action, decision.outcome) == (action, outcome)


def test_confirm_says_what_happened() -> None:
    assert confirm(("failed", "a"), ("healthy", "b"))[1].startswith("transient")
    assert confirm(("failed", "a"), ("failed", "b")) == ("failed", "b (repeated on retry)")


def test_training_checks() -> None:
    good = training_checks([4.0, 3.5, 3.0, 2.0, 1.0, 0.5, 0.4, 0.3], [0.01] * 8, max_spread=3)
    assert [c.status for c in good] == ["ok", "ok", "ok"]
    flat = training_checks([4.0] * 8, [0.01] * 8, max_spread=3)
    assert flat[1].status == "failed" and "4.000 -> 4.000" in flat[1].detail
    nan = training_checks([4.0, math.nan], [0.01] * 2, max_spread=3)
    assert nan[0].status == "failed" and "step 1" in nan[0].detail
    jumpy = training_checks([4, 3, 2, 1, 0.5], [0.01, 0.01, 0.01, 0.05, 0.05], max_spread=3)
    assert jumpy[-1].status == "failed"
    assert judge_checks(jumpy)[0] == "failed"
    assert judge_checks(good) == ("healthy", "all checks passed")


def test_partner_is_healthy_same_model_most_recently_proven() -> None:
    cands = [Candidate("a", "MI300X", "healthy", 10.0), Candidate("b", "MI300X", "healthy", 20.0),
             Candidate("c", "MI300X", "degraded", 30.0), Candidate("d", "H100", "healthy", 40.0),
             Candidate("e", "MI300X", "healthy", 50.0, alive=False)]
    assert choose_partner("x", "MI300X", cands) == "b"
    assert choose_partner("x", "MI300X", cands, exclude=["b"]) == "a"
    assert choose_partner("b", "MI300X", cands[1:2]) is None


def test_rendezvous_ports_and_group_outcomes() -> None:
    ports = {rendezvous_port(f"s{i}", base=29600, span=300) for i in range(200)}
    assert min(ports) >= 29600 and max(ports) < 29900 and len(ports) > 100
    assert group_passed({"a": (True, 10.0), "b": (True, 11.0)}, ["a", "b"],
                        reference_gbps=10.0, min_fraction=0.5) == (True, "ok")
    assert not group_passed({"a": (True, 10.0)}, ["a", "b"], reference_gbps=None,
                            min_fraction=0.5)[0]
    assert not group_passed({"a": (True, 4.0), "b": (True, 4.0)}, ["a", "b"],
                            reference_gbps=10.0, min_fraction=0.5)[0]
    assert not group_passed({"a": (False, None), "b": (True, 4.0)}, ["a", "b"],
                            reference_gbps=None, min_fraction=0.5)[0]


def test_a_retry_against_few_peers_takes_the_scatter_from_the_whole_sweep() -> None:
    from services.bench.fleet import fleet_spread

    sweep = peers(8, 0.01)
    for i, values in enumerate(sweep.values()):  # a noisy figure across the sweep
        values["train_tokens_per_s"] = 3000.0 * (1 + 0.15 * ((i % 3) - 1))
    helpers = {n: dict(v, train_tokens_per_s=3000.0 + i) for i, (n, v)
               in enumerate(list(sweep.items())[:4])}  # four fresh peers that agree closely
    retry = run(train_tokens_per_s=2200.0)  # 27% low on the noisy figure only
    alone = judge_node(retry, helpers, policy=POLICY)
    assert alone.outcome == "degraded"  # the helpers' tiny MAD makes noise look significant
    spread = fleet_spread(sweep)
    assert spread.figures["train_tokens_per_s"] > 0.1 > spread.figures["gemm_tflops"]
    assert judge_node(retry, helpers, policy=POLICY, spread=spread).outcome == "healthy"
    assert judge_node(run(0.9), helpers, policy=POLICY, spread=spread).outcome == "degraded"


def test_a_retry_with_a_different_symptom_is_transient() -> None:
    first = ("degraded", "allgather 28% below")
    other = decide(local=("healthy", ""), fleet=("degraded", "train 25% below"), first=first,
                   repeated=False)
    assert other.outcome == "healthy" and "showed something else" in other.reason
    same = decide(local=("healthy", ""), fleet=("degraded", "allgather 30% below"),
                  first=first, repeated=True)
    assert same.outcome == "degraded"
    broken = decide(local=("failed", "NaN"), fleet=("healthy", ""), first=first,
                    repeated=False)
    assert broken.outcome == "degraded"  # the milder of the two runs, never cleared


def test_repeats_weigh_a_suspect_without_its_first_run() -> None:
    from services.bench.fleet import fleet_spread, score_ratio, weigh_retries

    sweep = peers(8, 0.02, seed=3)
    calm = {n: judge_node(run(1.0), {m: v for m, v in sweep.items() if m != n}, policy=POLICY)
            for n in sweep}
    spread = fleet_spread(sweep, calm)
    helpers = dict(list(sweep.items())[:4])

    def repeat(scale: float):  # type: ignore[no-untyped-def]
        return judge_node(run(scale), helpers, policy=POLICY, spread=spread)

    def weigh(*scales: float):  # type: ignore[no-untyped-def]
        *before, last = [repeat(x) for x in scales]
        earlier = [(score_ratio(j), j.score_z) for j in before]
        return weigh_retries(last, earlier, policy=POLICY)  # type: ignore[arg-type]

    # One repeat: clearly low, clearly normal, or in between (measure again).
    evidence, judged = weigh(0.90)
    assert evidence == "low" and judged.score_flagged and judged.outcome == "degraded"
    assert weigh(1.0)[0] == "normal" and weigh(0.985)[0] == "normal"
    evidence, judged = weigh(0.965)
    assert evidence == "unsure" and judged.outcome == "healthy"
    # A node 10% slow whose first repeat came out only 3.5% low: the second
    # repeat settles it, over both repeats.
    evidence, judged = weigh(0.965, 0.90)
    assert evidence == "low" and "node_score" in judged.flagged
    assert "over 2 repeats" in judged.reason and judged.outcome == "degraded"
    # A healthy node that looked very low once (the first run, not weighed
    # here) and a little low on repeat: normal the next time, and cleared.
    evidence, judged = weigh(0.965, 1.0)
    assert evidence == "normal" and judged.outcome == "healthy"
    # The verdict of a confirmed repeat stands (the first run flagged its score too).
    first = judge_node(run(0.90), sweep, policy=POLICY, spread=spread)
    evidence, judged = weigh(0.965, 0.90)
    final = decide(local=("healthy", ""), fleet=(judged.outcome, judged.reason),
                   first=(first.outcome, first.reason),
                   repeated=bool(set(first.flagged) & set(judged.flagged)))
    assert final.outcome == "degraded"


def test_only_an_unsure_repeat_with_nothing_else_wrong_is_measured_again() -> None:
    from services.bench.triage import measure_again

    assert measure_again("unsure", attempt=2, max_retries=2, local="healthy", fleet="healthy")
    assert not measure_again("unsure", attempt=3, max_retries=2, local="healthy",
                             fleet="healthy")  # no repeats left
    assert not measure_again("unsure", attempt=2, max_retries=2, local="failed",
                             fleet="healthy")
    assert not measure_again("unsure", attempt=2, max_retries=2, local="healthy",
                             fleet="degraded")  # a figure says what is wrong already
    assert not measure_again("low", attempt=2, max_retries=2, local="healthy", fleet="healthy")
    assert not measure_again("normal", attempt=2, max_retries=2, local="healthy",
                             fleet="healthy")


def test_the_scatter_pooled_over_sweeps_keeps_one_lucky_figure_from_hiding_a_slow_node() -> None:
    from services.bench.fleet import SpreadHistory, fleet_spread, score_ratio

    rng = random.Random(5)

    def sweep(allreduce_noise: float) -> dict[str, dict[str, float]]:
        fleet = peers(7, 0.01, seed=rng.randrange(1000))
        for values in fleet.values():  # collectives on a shared CPU: noisy, mostly
            values["allreduce_gbps"] = 20.0 * (1 + rng.gauss(0, allreduce_noise))
        return fleet

    history = SpreadHistory(keep=4)
    for _ in range(6):  # earlier sweeps: allreduce scattered ~15%
        history.add("cpu", fleet_spread(sweep(0.15)))
    assert history.sweeps("cpu") == 4 and history.sweeps("MI300X") == 0
    # This sweep allreduce happened to scatter 1%, and the node that is 9%
    # slow in every steady figure got a lucky allreduce 8% above the median.
    today = sweep(0.01)
    slow = run(0.91, allreduce_gbps=21.6)
    alone = judge_node(slow, today, policy=POLICY)
    assert alone.outcome == "healthy"  # the lucky figure took most of the weight
    pooled = history.pooled("cpu", fleet_spread(today))
    assert pooled.figures["allreduce_gbps"] > 0.05 > pooled.figures["gemm_tflops"]
    judged = judge_node(slow, today, policy=POLICY, spread=pooled)
    assert judged.outcome == "degraded" and judged.flagged == ["node_score"]
    assert score_ratio(judged) == pytest.approx(0.91, abs=0.03)
    for seed in range(20):  # and the healthy nodes of such a sweep stay healthy
        mine = [(k, v, UNITS[k]) for k, v in peers(1, 0.01, seed=200 + seed)["p0"].items()]
        assert judge_node(mine, today, policy=POLICY, spread=pooled).outcome == "healthy"


def test_a_sweep_is_judged_with_the_larger_of_its_own_scatter_and_the_typical_one() -> None:
    from services.bench.fleet import Spread, SpreadHistory

    history = SpreadHistory(keep=3)
    assert history.pooled("cpu") == Spread({}, None)
    for gemm, triad in [(0.50, 0.5), (0.01, 0.2), (0.02, 0.3), (0.03, 0.1)]:  # 0.50 drops out
        history.add("cpu", Spread({"gemm": gemm, "triad": triad}, score=0.9))
    assert history.pooled("cpu") == Spread({"gemm": 0.02, "triad": 0.2}, None)
    # A lucky sweep (gemm 1%) takes the typical 2%; a disturbed one (triad
    # 40%) keeps its own; a figure the history lacks, its own; the score, its own.
    current = Spread({"gemm": 0.01, "triad": 0.4, "membw": 0.07}, score=0.015)
    assert history.pooled("cpu", current) == Spread(
        {"gemm": 0.02, "membw": 0.07, "triad": 0.4}, 0.015)
    assert history.pooled("MI300X", current) == current
