"""The leader-election policy (``libs.leader.decide``) as scenarios: given what
a candidate holds, what the lease bucket showed and the time, what it does."""

from __future__ import annotations

from pathlib import Path

import pytest

from libs.leader import (
    FENCE,
    Action,
    Held,
    Seen,
    decide,
    fence_after,
    holder_name,
    leads,
    tick_s,
)

TTL = 10.0  # fence at 8 s, renewals from 3.33 s
ME, OTHER = "sched-a", "sched-b"
HELD = Held(term=7, revision=9, renewed_at=100.0)
OURS = Seen(ME, 9)

# (name, held, seen, seen_known, now, expected action)
SCENARIOS = [
    ("free lease: take it", None, None, True, 100.0, Action.TAKE),
    ("another leads: wait", None, Seen(OTHER, 3), True, 100.0, Action.WAIT),
    ("our own lease after a restart: take it back", None, Seen(ME, 3), True, 100.0,
     Action.TAKE),
    ("cannot read, hold nothing: wait", None, None, False, 100.0, Action.WAIT),
    ("fresh lease: keep leading", HELD, OURS, True, 101.0, Action.WAIT),
    ("a third of the ttl gone: renew", HELD, OURS, True, 104.0, Action.RENEW),
    ("renew is due and the read failed: still renew", HELD, None, False, 105.0, Action.RENEW),
    ("key gone (expired or deleted): step down", HELD, None, True, 101.0, Action.STEP_DOWN),
    ("someone else holds it: step down", HELD, Seen(OTHER, 12), True, 101.0,
     Action.STEP_DOWN),
    ("ours but a revision we did not write: step down", HELD, Seen(ME, 10), True, 101.0,
     Action.STEP_DOWN),
    ("no renewal until the fence: step down", HELD, OURS, True, 100.0 + FENCE * TTL,
     Action.STEP_DOWN),
    ("no renewal, cannot read, past the fence: step down", HELD, None, False, 109.0,
     Action.STEP_DOWN),
    ("just before the fence: renew (not yet step down)", HELD, OURS, True,
     100.0 + FENCE * TTL - 0.01, Action.RENEW),
]


@pytest.mark.parametrize(("name", "held", "seen", "known", "now", "action"), SCENARIOS,
                         ids=[s[0] for s in SCENARIOS])
def test_decide(name: str, held: Held | None, seen: Seen | None, known: bool, now: float,
                action: Action) -> None:
    decision = decide(me=ME, held=held, seen=seen, seen_known=known, now=now, ttl_s=TTL)
    assert decision.action is action, decision.reason
    assert decision.reason


def test_the_step_down_reason_names_the_new_holder() -> None:
    decision = decide(me=ME, held=HELD, seen=Seen(OTHER, 12), now=101.0, ttl_s=TTL)
    assert OTHER in decision.reason and "12" in decision.reason


def test_a_leader_stops_acting_before_the_server_can_expire_its_lease() -> None:
    # The server keeps the key ttl after it received the renewal, which is
    # after we sent it: acting must end strictly inside that.
    assert fence_after(TTL) < TTL
    assert fence_after(TTL) == 8.0
    assert leads(HELD, now=107.99, ttl_s=TTL)
    assert not leads(HELD, now=108.0, ttl_s=TTL)
    assert not leads(None, now=100.0, ttl_s=TTL)


@pytest.mark.parametrize("ttl", [2.0, 6.0, 15.0, 60.0])
def test_a_healthy_leader_renews_at_least_twice_before_the_fence(ttl: float) -> None:
    """Walk a leader through time tick by tick, renewing whenever told: it
    never reaches the fence, and renews between ttl/3 and ttl/3 + a tick."""
    held = Held(term=1, revision=1, renewed_at=0.0)
    now, renewals = 0.0, 0
    while now < 10 * ttl:
        now += tick_s(ttl)
        decision = decide(me=ME, held=held, seen=Seen(ME, held.revision), now=now, ttl_s=ttl)
        assert decision.action is not Action.STEP_DOWN, (now, decision)
        if decision.action is Action.RENEW:
            assert ttl / 3 <= now - held.renewed_at <= ttl / 3 + tick_s(ttl) + 1e-9
            held = Held(term=1, revision=held.revision + 1, renewed_at=now)
            renewals += 1
    assert renewals >= 10
    # Failed renewals from the last success onwards: ticks left to retry before the fence.
    assert (fence_after(ttl) - ttl / 3) / tick_s(ttl) >= 2


def test_holder_name_is_stable_per_host_and_state_dir(tmp_path: Path) -> None:
    assert holder_name("pod-7", tmp_path) == "pod-7"
    a, b = holder_name(None, tmp_path / "a"), holder_name(None, tmp_path / "b")
    assert a != b
    assert holder_name(None, tmp_path / "a") == a  # a restart is the same replica
