"""Per-service NATS users whose permissions follow from the event contract.

Every service talks to NATS as its own user, allowed to publish only the
events it owns and to read only the streams, consumers and KV buckets it
uses. The table below (``ROLES``) says, next to the contract, what each
service produces, consumes, reads, writes, serves and calls; the NATS
subjects, JetStream API subjects included, are derived from it and from the
streams and buckets in ``libs.bus``. A bench agent that tried to publish
``safe.job.x.placed`` or write the ``jobs`` bucket is refused by the server.

``tests/unit/test_nats_permissions_contract.py`` checks the services against
the table (every event class a service constructs is one its user may
publish; every durable it declares is in the table) and
``tests/integration/test_nats_permissions.py`` proves the rendered config on
a real nats-server. The Helm chart ships the rendered users
(``python -m libs.nats_permissions --write``, a test fails on drift).

Everything here is pure: data in, data out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from libs.bus import (
    CONTROL,
    HEALTH_SUBJECT,
    KV_BUCKETS,
    STREAMS,
    TELEMETRY,
    StreamSpec,
    dlq_subject,
)
from libs.bus import QUERY_SUBJECT as _QUERY
from libs.events import (
    SUBJECT_ROOT,
    BenchRequest,
    BenchResult,
    Event,
    FaultClosed,
    FaultMitigated,
    FaultOpened,
    FaultRecovered,
    JobCompleted,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobRecover,
    JobSubmitted,
    JobTelemetry,
    LensAlert,
    LogRecord,
    NodeHeartbeat,
    NodeProvisioned,
    NodeRegistered,
    NodeRemoved,
    NodeStateChanged,
    NodeTelemetry,
    WorkerExited,
    WorkerStarted,
)
from libs.leader import LEASES_BUCKET

INBOX = "_INBOX.>"
ANY_DURABLE = "*"  # a durable whose name carries a key (one per node)
# Request-reply subjects outside the event streams (services/*/protocol.py).
LENS_QUERY = f"{SUBJECT_ROOT}.lens.query"
BENCH_PROGRESS = f"{SUBJECT_ROOT}.progress.bench.*"


def query(name: str) -> str:
    return _QUERY.format(name=name)


def event_subject(cls: type[Event]) -> str:
    """The subject pattern every event of ``cls`` is published on."""
    return cls.subject_template.format(root=SUBJECT_ROOT, node="*", job="*")


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer a service declares (Bus.consume / consume_raw)."""

    stream: StreamSpec
    durable: str
    subjects: tuple[str, ...]


@dataclass(frozen=True)
class Role:
    """One NATS user: what its service does on the bus."""

    name: str  # the user name; also the service name Bus.connect gets
    produces: tuple[type[Event], ...] = ()
    consumes: tuple[Consumer, ...] = ()
    kv_read: tuple[str, ...] = ()
    kv_write: tuple[str, ...] = ()
    serves: tuple[str, ...] = ()  # core subjects whose requests it answers
    listens: tuple[str, ...] = ()  # subjects it watches live (core subscriptions)
    leases: tuple[str, ...] = ()  # its keys in the leader-lease bucket (libs.leader)
    calls: tuple[str, ...] = ()  # core subjects it publishes to (requests, shares)
    service: bool = True  # runs under libs/service.py: declares topology, answers health


@dataclass(frozen=True)
class Permissions:
    publish_allow: tuple[str, ...]
    publish_deny: tuple[str, ...]
    subscribe_allow: tuple[str, ...]
    allow_responses: bool


# --------------------------------------------------------------------------- the table
# Read from each service's app (start() and its publish calls). Every service
# may ship its log lines (PRIMUS_LOG_SHIP) so every one produces LogRecord.

ROLES: tuple[Role, ...] = (
    Role(
        "bootstrap",
        produces=(NodeRegistered, NodeStateChanged, NodeRemoved, BenchRequest, LogRecord),
        consumes=(
            Consumer(CONTROL, "bootstrap",
                     (event_subject(BenchResult), event_subject(FaultOpened))),
            Consumer(CONTROL, "bootstrap-provisioned", (event_subject(NodeProvisioned),)),
        ),
        kv_read=("jobs",),
        kv_write=("nodes", "inventory"),
        # The operator's hand-over of an edited hosts file (services/bootstrap/protocol.py).
        serves=(query("bootstrap.apply"), query("bootstrap.remove")),
    ),
    Role(
        "scheduler",
        # The cluster drivers (libs/drivers) run inside the scheduler and
        # report the workers they start and see exit.
        produces=(JobPlaced, JobPending, JobPreempted, JobCompleted, JobFailed,
                  WorkerStarted, WorkerExited, LogRecord),
        consumes=(Consumer(CONTROL, "scheduler", (
            event_subject(NodeRegistered), event_subject(NodeStateChanged),
            event_subject(JobSubmitted), event_subject(JobRecover), event_subject(WorkerExited),
        )),),
        kv_read=("nodes",),
        kv_write=("jobs",),
        leases=("scheduler",),
        # primus-safe submit asks whether a job can ever run (services/scheduler/protocol.py).
        serves=(query("scheduler.admission"),),
    ),
    Role(
        "bench-agent",
        produces=(NodeHeartbeat, NodeTelemetry, BenchResult, LogRecord),
        # One durable per node (bench-agent-<node>), each filtered to its
        # node's requests; the agents share one user.
        consumes=(Consumer(CONTROL, ANY_DURABLE, (event_subject(BenchRequest),)),),
        calls=(query("bench.pair"), query("bench.share.*"), query("bench.turn.*"),
               BENCH_PROGRESS),
    ),
    Role(
        "bench-coordinator",
        produces=(BenchRequest, BenchResult, LogRecord),
        consumes=(Consumer(CONTROL, "bench-coordinator", (event_subject(BenchResult),)),),
        kv_read=("nodes",),
        kv_write=("bench",),
        leases=("bench-coordinator",),
        serves=(query("bench.report"), query("bench.pair"), query("bench.search"),
                query("bench.sweep"), query("bench.share.*"), query("bench.turn.*")),
    ),
    Role(
        "lens-collector",
        produces=(LensAlert, LogRecord),
        consumes=(
            Consumer(CONTROL, "lens-events", CONTROL.subjects),
            Consumer(TELEMETRY, "lens-telemetry", TELEMETRY.subjects),
        ),
        leases=("lens-alerts",),  # the replica that evaluates the alert rules
        serves=(LENS_QUERY,),
    ),
    Role(
        "failover",
        produces=(FaultOpened, FaultMitigated, FaultRecovered, FaultClosed, JobRecover, LogRecord),
        consumes=(
            Consumer(CONTROL, "failover", (
                event_subject(NodeHeartbeat), event_subject(NodeRegistered),
                event_subject(NodeStateChanged), event_subject(JobPlaced),
                event_subject(JobCompleted), event_subject(JobFailed),
                event_subject(JobPreempted),
                event_subject(BenchResult), event_subject(WorkerExited),
                f"{SUBJECT_ROOT}.lens.alert.>",
            )),
            Consumer(TELEMETRY, "failover-steps", (f"{SUBJECT_ROOT}.telemetry.job.>",)),
        ),
        kv_write=("faults",),
    ),
    # The operator's CLI (primus-safe submit, jobs, nodes, bench, lens, health).
    Role(
        "cli",
        produces=(JobSubmitted, NodeProvisioned, BenchRequest),
        kv_read=tuple(KV_BUCKETS),
        listens=(event_subject(BenchResult), BENCH_PROGRESS),  # bench run --wait
        calls=(query(">"), LENS_QUERY, HEALTH_SUBJECT.format(service=">")),
        service=False,
    ),
    # Training workers (libs/sdk.py): their own telemetry and log lines only.
    Role("trainer", produces=(JobTelemetry, LogRecord), service=False),
)
# Grafana reads ClickHouse only: no NATS user.

ROLE_NAMES: tuple[str, ...] = tuple(r.name for r in ROLES)


def role(name: str) -> Role:
    for r in ROLES:
        if r.name == name:
            return r
    raise KeyError(f"no NATS role {name!r}; known: {', '.join(ROLE_NAMES)}")


# --------------------------------------------------------------------------- derivation


def _kv_read(bucket: str) -> list[str]:
    stream = f"KV_{bucket}"
    return [f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            # keys() and watch() run an ordered push consumer on the bucket.
            f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.INFO.{stream}.*", f"$JS.API.CONSUMER.DELETE.{stream}.*",
            f"$JS.FC.{stream}.>"]


def _topology() -> list[str]:
    # libs/service.py declares every stream and bucket at start-up (idempotent;
    # UPDATE only when a new release changed a config). Never DELETE or PURGE.
    names = [s.name for s in STREAMS] + [f"KV_{b}" for b in KV_BUCKETS]
    return [f"$JS.API.STREAM.{verb}.{n}" for n in names for verb in ("CREATE", "UPDATE", "INFO")]


def _consumer(c: Consumer) -> list[str]:
    s, d = c.stream.name, c.durable
    # Bus creates consumers by name (CONSUMER.CREATE, nats-server >= 2.9): a
    # single filter travels in the API subject, so the server checks it and a
    # role cannot widen its consumer to subjects it was not given. Several
    # filters ride in the body; then only the durable's name is pinned.
    create = (f"$JS.API.CONSUMER.CREATE.{s}.{d}.{c.subjects[0]}" if len(c.subjects) == 1
              else f"$JS.API.CONSUMER.CREATE.{s}.{d}")
    return [create, f"$JS.API.CONSUMER.INFO.{s}.{d}", f"$JS.API.CONSUMER.MSG.NEXT.{s}.{d}",
            f"$JS.ACK.{s}.{d}.>"]


def _others_durables(r: Role, roles: Iterable[Role]) -> list[str]:
    """A role whose durable names carry a key gets ``*``: deny it every named
    durable of the other roles on the same stream, so it cannot pull, inspect
    or ack their messages."""
    wild = {c.stream.name for c in r.consumes if c.durable == ANY_DURABLE}
    deny: list[str] = []
    for other in roles:
        for c in other.consumes:
            if other.name != r.name and c.stream.name in wild and c.durable != ANY_DURABLE:
                s, d = c.stream.name, c.durable
                deny += [f"$JS.API.CONSUMER.MSG.NEXT.{s}.{d}", f"$JS.API.CONSUMER.INFO.{s}.{d}",
                         f"$JS.ACK.{s}.{d}.>", f"$JS.API.CONSUMER.CREATE.{s}.{d}",
                         f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.{d}",
                         f"$JS.API.CONSUMER.CREATE.{s}.{d}.>"]
    return deny


def permissions(r: Role, roles: Iterable[Role] = ROLES) -> Permissions:
    """The subjects ``r`` may publish and subscribe to. Pure."""
    pub: list[str] = [event_subject(cls) for cls in r.produces]
    sub: list[str] = [INBOX]  # replies: JetStream acks, API answers, KV gets
    pub += list(r.calls)
    sub += list(r.serves) + list(r.listens)
    for bucket in r.kv_read + r.kv_write:
        pub += _kv_read(bucket)
    for bucket in r.kv_write:
        pub.append(f"$KV.{bucket}.>")
        if bucket not in KV_BUCKETS:  # made by its owner on first use, not by the topology
            pub += [f"$JS.API.STREAM.CREATE.KV_{bucket}", f"$JS.API.STREAM.INFO.KV_{bucket}"]
    if r.leases:  # read every lease, write only its own key
        pub += _kv_read(LEASES_BUCKET) + [f"$KV.{LEASES_BUCKET}.{key}" for key in r.leases]
    for c in r.consumes:
        pub += _consumer(c)
    if r.consumes:
        pub.append(dlq_subject(r.name))
    if r.service:
        pub += _topology()
        health = HEALTH_SUBJECT.format(service=r.name)
        # It answers its health request; its probe (primus-safe health) asks.
        sub += [health, f"{health}.*"]
        pub += [health, f"{health}.*"]
    return Permissions(
        publish_allow=_unique(pub),
        publish_deny=_unique(_others_durables(r, roles)),
        subscribe_allow=_unique(sub),
        allow_responses=bool(r.serves) or r.service,
    )


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def password_env(name: str) -> str:
    """The environment variable the NATS server reads a role's password from."""
    return "NATS_PASSWORD_" + name.upper().replace("-", "_")


def secret_key(name: str) -> str:
    """The key of a role's password in the chart's Secret."""
    return f"nats-password-{name}"


# --------------------------------------------------------------------------- rendering


def _list(items: Iterable[str], pad: str) -> str:
    return "[\n" + "".join(f"{pad}  {json.dumps(i)}\n" for i in items) + f"{pad}]"


def render_users(roles: Iterable[Role] = ROLES, *, indent: int = 2) -> str:
    """The ``users = [...]`` of a nats-server ``authorization`` block.

    Passwords are ``$NATS_PASSWORD_<ROLE>`` references the server resolves
    from its environment, so the config never holds a secret. Subjects are
    quoted: unquoted ``$JS...`` would read as a variable."""
    roles = tuple(roles)
    pad = " " * indent
    lines = ["users = ["]
    for r in roles:
        p = permissions(r, roles)
        lines.append(f"{pad}{{")
        lines.append(f"{pad}  user: {json.dumps(r.name)}")
        lines.append(f"{pad}  password: ${password_env(r.name)}")
        lines.append(f"{pad}  permissions: {{")
        inner = pad + "      "
        lines.append(f"{pad}    publish: {{")
        lines.append(f"{inner}allow: {_list(p.publish_allow, inner)}")
        if p.publish_deny:
            lines.append(f"{inner}deny: {_list(p.publish_deny, inner)}")
        lines.append(f"{pad}    }}")
        lines.append(f"{pad}    subscribe: {{allow: {_list(p.subscribe_allow, inner)}}}")
        if p.allow_responses:
            lines.append(f"{pad}    allow_responses: true")
        lines.append(f"{pad}  }}")
        lines.append(f"{pad}}}")
    lines.append("]")
    return "\n".join(lines) + "\n"


HEADER = ("# Generated by `python -m libs.nats_permissions --write` from the event\n"
          "# contract (libs/events.py, libs/bus.py, libs/nats_permissions.py ROLES).\n"
          "# Do not edit: a test fails when this file and the code drift.\n")
CHART_FILE = Path(__file__).resolve().parents[1] / "deploy/helm/primus-safe/files/nats-users.conf"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help=f"write {CHART_FILE.name} for the chart")
    parser.add_argument("--check", action="store_true", help="exit 1 when the chart's copy drifted")
    args = parser.parse_args(argv)
    text = HEADER + render_users()
    if args.write:
        CHART_FILE.parent.mkdir(parents=True, exist_ok=True)
        CHART_FILE.write_text(text)
    elif args.check:
        if not CHART_FILE.exists() or CHART_FILE.read_text() != text:
            print(f"{CHART_FILE} is out of date: run python -m libs.nats_permissions --write",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
