"""NATS server lists: one URL, or several joined by commas.

``PRIMUS_NATS_URL`` may name every server of a NATS cluster
(``nats://a:4222,nats://b:4222,nats://c:4222``) so that a client whose
server is down at start, or dies later, can reach another one. nats-py takes
a list, not a comma-joined string; the lean connections (``libs.natsfast``,
``libs.beats``) try the servers in turn.
"""

from __future__ import annotations

from urllib.parse import SplitResult, quote, unquote, urlsplit, urlunsplit


def servers(url: str) -> list[str]:
    """The servers of ``url``, in the order given."""
    return [u.strip() for u in url.split(",") if u.strip()]


def split_login(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without ``user:password@`` in any server, and the login the
    first server carried (user, password; a user alone is a token).

    nats-py adds the servers a cluster announces (INFO ``connect_urls``)
    without a login, and after a reconnect to one of those it signs in with
    its options only: a login that rode in the URL must become options, or
    the first reconnect to a discovered server is refused."""
    user = password = None
    bare = []
    for one in servers(url):
        parts = urlsplit(one)
        if parts.username is not None and user is None:
            user, password = unquote(parts.username), (
                unquote(parts.password) if parts.password is not None else None)
        bare.append(urlunsplit(parts._replace(netloc=_host_port(parts))))
    return ",".join(bare), user, password


def with_login(url: str, user: str, password: str | None) -> str | None:
    """Every server of ``url`` with ``user:password@`` in it, joined by
    commas; None when the login has characters a URL would need to escape
    (the lean connection reads it as is)."""
    auth = user + (f":{password}" if password else "")
    if quote(auth, safe=":") != auth:
        return None
    out = []
    for one in servers(url):
        parts = urlsplit(one)
        out.append(urlunsplit(parts._replace(netloc=f"{auth}@{_host_port(parts)}")))
    return ",".join(out)


def _host_port(parts: SplitResult) -> str:
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address keeps its brackets
    return host + (f":{parts.port}" if parts.port else "")
