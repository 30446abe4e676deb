"""Server lists in ``PRIMUS_NATS_URL`` and the login that rides in them."""

from __future__ import annotations

from libs.nats_urls import servers, split_login, with_login


def test_a_comma_separated_url_is_every_server_in_order() -> None:
    assert servers(" nats://a:1, nats://b:2 ,,nats://c:3") == [
        "nats://a:1", "nats://b:2", "nats://c:3"]
    assert servers("nats://a:4222") == ["nats://a:4222"]


def test_the_login_leaves_every_server_and_becomes_options() -> None:
    bare, user, password = split_login(
        "nats://platform:p%40ss@127.0.0.1:4222,nats://platform:p%40ss@[::1]:4223")
    assert bare == "nats://127.0.0.1:4222,nats://[::1]:4223"
    assert (user, password) == ("platform", "p@ss")


def test_a_user_alone_is_a_token_and_no_login_is_none() -> None:
    assert split_login("nats://s3cret@a:1") == ("nats://a:1", "s3cret", None)
    assert split_login("nats://a:1,tls://b:2") == ("nats://a:1,tls://b:2", None, None)


def test_the_lean_connection_gets_the_login_on_every_server() -> None:
    assert with_login("nats://a:1,nats://[::1]:2", "bench-agent", "pw") == (
        "nats://bench-agent:pw@a:1,nats://bench-agent:pw@[::1]:2")
    assert with_login("nats://a:1", "user", None) == "nats://user@a:1"
    # A login a URL would have to escape is not handed to the lean reader.
    assert with_login("nats://a:1", "user", "p@ss/word") is None
