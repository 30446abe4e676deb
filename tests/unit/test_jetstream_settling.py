"""Which JetStream refusals ``Bus.ensure_topology`` waits out. The bodies
are the API's own error answers: 10005 and 10023 as a NATS cluster gives them
while its members are still being heard from (10005 is the one a CI run met
on a freshly formed three-server cluster, declaring the buckets), 10074 and
10058 as a single server gives them."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from libs.bus import settling


def answered(code: int, err_code: int, description: str) -> nats.js.errors.APIError:
    try:
        nats.js.errors.APIError.from_error(
            {"code": code, "err_code": err_code, "description": description})
    except nats.js.errors.APIError as exc:
        return exc
    raise AssertionError("from_error always raises")


@pytest.mark.parametrize("exc", [
    answered(400, 10005, "no suitable peers for placement, peer offline"),
    answered(500, 10023, "insufficient resources"),
    answered(503, 10008, "JetStream system temporarily unavailable"),
    nats.errors.TimeoutError(),
    nats.errors.NoRespondersError(),
], ids=["no-suitable-peers", "insufficient-resources", "unavailable", "timeout",
        "no-responders"])
def test_a_cluster_still_settling_is_asked_again(exc: Exception) -> None:
    assert settling(exc)


@pytest.mark.parametrize("exc", [
    answered(500, 10074, "replicas > 1 not supported in non-clustered mode"),
    answered(400, 10058, "stream name already in use with a different configuration"),
    ValueError("a bug of ours"),
], ids=["replicas-on-one-server", "name-in-use", "other"])
def test_a_refusal_that_stands_is_raised_at_once(exc: Exception) -> None:
    assert not settling(exc)
