"""The binary-split search over simulated fleets: every placement of one and
of two bad nodes, in at most ceil(log2 n) rounds."""

from __future__ import annotations

import itertools
import math

import pytest

from services.bench.split_search import Group, SplitSearch, run_search
from services.bench.triage import waves

HEALTHY = ["h1", "h2", "h3", "h4"]


def fleet(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(n)]


def oracle(bad: set[str], log: list[Group] | None = None):  # type: ignore[no-untyped-def]
    def test(group: Group) -> bool:
        if log is not None:
            log.append(group)
        assert len(group.nodes) >= 2, "a collective needs two nodes"
        return not bad & set(group.nodes)
    return test


@pytest.mark.parametrize("n", range(2, 33))
def test_every_single_bad_node_is_found_in_log2_rounds(n: int) -> None:
    nodes = fleet(n)
    for bad in nodes:
        tested: list[Group] = []
        search = run_search(nodes, HEALTHY, oracle({bad}, tested))
        assert search.bad == [bad]
        assert search.rounds <= math.ceil(math.log2(n))
        assert search.tests <= 2 * math.ceil(math.log2(n))
        assert set(search.cleared) == set(nodes) - {bad}
        assert search.inconclusive == []
        assert all(g.helpers and set(g.helpers) <= set(HEALTHY) | set(nodes) for g in tested)


@pytest.mark.parametrize("n", range(2, 25))
def test_every_pair_of_bad_nodes_is_found_in_log2_rounds(n: int) -> None:
    nodes = fleet(n)
    for pair in itertools.combinations(nodes, 2):
        search = run_search(nodes, HEALTHY, oracle(set(pair)))
        assert search.bad == sorted(pair), pair
        assert search.rounds <= math.ceil(math.log2(n))
        assert search.tests <= 4 * math.ceil(math.log2(n))  # at most 2b tests a round
        assert set(search.cleared) == set(nodes) - set(pair)


def test_without_known_healthy_nodes_cleared_nodes_become_helpers() -> None:
    nodes = fleet(8)
    for bad in nodes:
        search = run_search(nodes, [], oracle({bad}))
        assert search.bad == [bad]


def test_two_nodes_and_no_helper_is_inconclusive_rather_than_a_guess() -> None:
    search = run_search(["a", "b"], [], oracle({"a"}))
    assert search.bad == [] and search.inconclusive == [("a", "b")]


def test_a_failure_that_needs_both_halves_is_inconclusive() -> None:
    # The collective fails only when a and h meet (a bad cable between them).
    def test(group: Group) -> bool:
        return not {"n00", "n05"} <= set(group.nodes)

    search = run_search(fleet(8), HEALTHY, test)
    assert search.bad == [] and search.inconclusive == [tuple(fleet(8))]


def test_a_lone_suspect_is_the_bad_node_and_rounds_must_be_recorded() -> None:
    assert SplitSearch.start(["x"], HEALTHY).bad == ["x"]
    search = SplitSearch.start(fleet(4), HEALTHY)
    groups = search.next_round()
    with pytest.raises(RuntimeError):
        search.next_round()
    with pytest.raises(KeyError):
        search.record({groups[0]: True})


def test_groups_of_a_round_get_different_helpers_and_waves_never_share_a_node() -> None:
    search = SplitSearch.start(fleet(16), ["h1", "h2", "h3", "h4"])
    first = search.next_round()
    search.record({first[0]: False, first[1]: False})  # two bad nodes, one in each half
    groups = search.next_round()
    assert len(groups) == 4
    assert len({g.helpers for g in groups}) == 4
    for wave in waves(groups):
        used = [n for g in wave for n in g.nodes]
        assert len(used) == len(set(used))
    shared = [Group(("a",), ("h",)), Group(("b",), ("h",)), Group(("c",), ("k",))]
    assert waves(shared) == [[shared[0], shared[2]], [shared[1]]]
