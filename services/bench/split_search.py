"""Finding the bad node(s) behind a failing multi-node collective (pure).

When an all-reduce over n nodes fails or is slow, testing every node alone
takes n tests; halving takes O(log n) rounds. Each round splits every set
still known to hold a bad node into two halves and tests each half as its
own collective, joined by a node known to be healthy (so a half of one node
is still a multi-node test, and a passing half clears its members). A half
that fails holds a bad node and is split again; a set of one that failed is
a bad node. With b bad nodes a round runs at most 2b tests, and the search
ends after ceil(log2 n) rounds.

If both halves of a failing set pass, the failure needed nodes from both
halves together (a cable between them, a switch port) or was transient: the
set is reported as *inconclusive* rather than guessed at.

This module only decides; the coordinator runs the tests (pair requests
with a rendezvous) and feeds the outcomes back with ``record``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Group:
    """One collective to run: the suspects under test plus known-healthy helpers."""

    members: tuple[str, ...]
    helpers: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.members + self.helpers


@dataclass
class SplitSearch:
    suspects: tuple[str, ...]
    healthy: list[str]
    failing: list[tuple[str, ...]] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    inconclusive: list[tuple[str, ...]] = field(default_factory=list)
    rounds: int = 0
    tests: int = 0
    _pending: dict[Group, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def start(cls, suspects: Iterable[str], healthy: Iterable[str] = ()) -> SplitSearch:
        """``suspects``: the nodes of the collective that failed (so at least one
        of them is bad); ``healthy``: nodes known good, used as helpers."""
        ordered = tuple(sorted(set(suspects)))
        helpers = sorted(set(healthy) - set(ordered))
        search = cls(ordered, helpers)
        if len(ordered) == 1:
            search.bad.append(ordered[0])
        elif ordered:
            search.failing.append(ordered)
        return search

    @property
    def done(self) -> bool:
        return not self.failing and not self._pending

    def next_round(self) -> list[Group]:
        """The groups to test now, in parallel where their nodes differ.
        Empty when the search is done."""
        if self._pending:
            raise RuntimeError("record the outcomes of the current round first")
        groups: list[Group] = []
        still: list[tuple[str, ...]] = []
        spare = iter(self.healthy * (2 * len(self.failing) + 1))
        for suspects in self.failing:
            half = (len(suspects) + 1) // 2
            halves = [suspects[:half], suspects[half:]]
            if not self.healthy and any(len(h) == 1 for h in halves):
                still.append(suspects)  # a lone node needs a healthy partner
                continue
            for members in halves:
                helper = () if not self.healthy else (next(spare),)
                group = Group(members, helper)
                groups.append(group)
                self._pending[group] = suspects
        if still and not groups:
            # Nobody known healthy and nothing left to split: say so.
            self.inconclusive.extend(still)
            self.failing = []
            return []
        self.failing = still
        if groups:
            self.rounds += 1
            self.tests += len(groups)
        return groups

    def record(self, passed: Mapping[Group, bool]) -> None:
        """The outcome of every group of the round (True: the collective passed)."""
        missing = [g for g in self._pending if g not in passed]
        if missing:
            raise KeyError(f"no outcome for {len(missing)} group(s), e.g. {missing[0].nodes}")
        by_parent: dict[tuple[str, ...], list[Group]] = {}
        for group, parent in self._pending.items():
            by_parent.setdefault(parent, []).append(group)
        for parent, groups in by_parent.items():
            failing = [g for g in groups if not passed[g]]
            for g in groups:
                if passed[g]:
                    self.cleared.extend(g.members)
                    self.healthy.extend(m for m in g.members if m not in self.healthy)
            if not failing:
                self.inconclusive.append(parent)
            for g in failing:
                if len(g.members) == 1:
                    self.bad.append(g.members[0])
                else:
                    self.failing.append(g.members)
        self._pending = {}
        self.bad.sort()
        self.cleared.sort()


def run_search(suspects: Iterable[str], healthy: Iterable[str],
               test: Callable[[Group], bool]) -> SplitSearch:
    """Drive a search to the end with a synchronous ``test`` (simulations, tests)."""
    search = SplitSearch.start(suspects, healthy)
    while not search.done:
        groups = search.next_round()
        if not groups:
            break
        search.record({g: test(g) for g in groups})
    return search
