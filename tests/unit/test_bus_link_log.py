"""The connection's error log during an outage (``libs.bus.Link``): nats-py
reports every failed reconnect, twice a second, so a repeated error is
counted and logged at most every ``ERROR_LOG_EVERY_S``."""

from __future__ import annotations

from libs.bus import ERROR_LOG_EVERY_S, Link


def test_a_repeated_error_is_logged_once_per_period_with_the_count_kept_quiet() -> None:
    link = Link(state="disconnected")
    refused = "[Errno 111] Connect call failed"
    assert link.log_error(refused, 0.0) == 0
    assert [link.log_error(refused, 0.5 * i) for i in range(1, 10)] == [None] * 9
    assert link.log_error(refused, ERROR_LOG_EVERY_S) == 9
    assert link.log_error(refused, ERROR_LOG_EVERY_S + 1) is None


def test_a_different_error_is_logged_at_once() -> None:
    link = Link(state="disconnected")
    assert link.log_error("refused", 0.0) == 0
    assert link.log_error("refused", 1.0) is None
    assert link.log_error("Authorization Violation", 2.0) == 1
    assert link.log_error("refused", 3.0) == 0


def test_back_reports_the_outage_and_starts_the_next_one_afresh() -> None:
    link = Link(state="connected")
    assert link.back(5.0) is None  # never down
    link.down_since = 10.0
    link.log_error("refused", 10.0)
    link.log_error("refused", 10.5)
    link.log_error("refused", 11.0)
    assert link.back(22.5) == (12.5, 2)
    assert link.log_error("refused", 23.0) == 0  # a new outage's first error is logged
