"""Fleet-relative verdicts as scenarios."""

from __future__ import annotations

from services.bench.fleet import NodeFigure, compare_with_fleet

HIB = {"tflops"}


def fleet(values: dict[str, float], model: str = "MI300X") -> list[NodeFigure]:
    return [NodeFigure(n, model, "tflops", v, "TFLOPS") for n, v in values.items()]


def test_a_slow_node_is_flagged_and_listed_first() -> None:
    figs = fleet({"a": 100.0, "b": 101.0, "c": 99.5, "d": 100.5, "e": 90.0})
    result = compare_with_fleet(figs, higher_is_better=HIB)
    assert result[0].node == "e" and result[0].flagged
    assert round(result[0].relative, 3) == -0.1
    assert [d.node for d in result if d.flagged] == ["e"]


def test_noise_within_min_drop_is_not_flagged() -> None:
    figs = fleet({"a": 100.0, "b": 100.0, "c": 100.0, "d": 97.0})
    assert not any(d.flagged for d in compare_with_fleet(figs, higher_is_better=HIB))


def test_models_are_judged_apart_and_small_fleets_abstain() -> None:
    figs = fleet({"a": 100.0, "b": 100.0, "c": 100.0}) + fleet({"x": 10.0, "y": 50.0}, "MI250X")
    result = {d.node: d for d in compare_with_fleet(figs, higher_is_better=HIB)}
    assert result["x"].median == 30.0 and result["x"].peers == 2
    assert not result["x"].flagged  # two peers cannot say who is wrong
    assert result["a"].median == 100.0


def test_figures_not_known_to_be_higher_is_better_are_ignored() -> None:
    figs = [NodeFigure("a", "m", "latency", 1.0, "ms")]
    assert compare_with_fleet(figs, higher_is_better=HIB) == []
