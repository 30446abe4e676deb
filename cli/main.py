"""``primus-safe``: one entry point for every service and operator verb.

Errors meant for the operator (bad files, nothing running) print one clear
message on stderr and exit non-zero; listings take ``--json``.
"""

from __future__ import annotations

import sys

from libs import shutdown

SERVICE_VERBS = ("bootstrap", "scheduler", "bench-agent", "bench-coordinator", "lens-collector",
                 "failover")


def _runs_a_service(argv: list[str]) -> bool:
    """``primus-safe <service> [--flag value ...]``: no action word (such as
    ``bootstrap apply`` or ``failover history``), so this process is a service."""
    if not argv[1:2] or argv[1] not in SERVICE_VERBS:
        return False
    rest = argv[2:]
    return all(a.startswith("-") or (i > 0 and rest[i - 1].startswith("--"))
               for i, a in enumerate(rest))


if _runs_a_service(sys.argv):
    # A SIGTERM during the imports below (most of a second) must still stop
    # the service cleanly (libs/shutdown.py).
    shutdown.catch_early()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import nats.errors  # noqa: E402

from cli import job_verbs, lens_verbs, logs_verb, node_verbs  # noqa: E402
from cli.client import CliError, bus_failure, connect, read_bucket, submit  # noqa: E402
from cli.output import (  # noqa: E402
    add_output_flags,
    format_table,
    load_settings,
    print_rows,
    watch,
)
from libs.events import check_key  # noqa: E402
from libs.logs import configure  # noqa: E402
from libs.records import FAULTS, JOBS, NODES, BucketSpec, JobRecord, NodeRecord, R  # noqa: E402
from libs.specs import SpecError  # noqa: E402

# --------------------------------------------------------------------------- services


def run_service_verb(args: argparse.Namespace) -> int:
    shutdown.catch_early()  # also when called in-process (the module-level guard is argv's)
    from libs.service import serve

    settings = load_settings()
    node = None
    if args.verb == "bootstrap":
        from services.bootstrap.app import Bootstrap

        if args.hosts:
            settings = settings.model_copy(update={"hosts_file": Path(args.hosts)})
        make: Any = partial(Bootstrap, settings)
    elif args.verb == "scheduler":
        from services.scheduler.app import Scheduler

        make = partial(Scheduler, settings)
    elif args.verb == "bench-agent":
        from services.bench.agent import BenchAgent

        node = args.node or settings.node_name
        if not node:
            raise CliError("bench-agent needs a node name: --node NAME or PRIMUS_NODE_NAME")
        try:
            check_key(node, "node name")
        except ValueError as exc:
            raise CliError(f"--node: {exc}") from None
        make = partial(BenchAgent, settings, node)
    elif args.verb == "bench-coordinator":
        from services.bench.coordinator import BenchCoordinator

        make = partial(BenchCoordinator, settings)
    elif args.verb == "lens-collector":
        from services.lens_collector.app import LensCollector

        make = partial(LensCollector, settings)
    else:
        from services.failover.app import Failover

        make = partial(Failover, settings)
    # A factory: a connection the server closes is survived with a fresh instance.
    return serve(make, settings, node=node)


# --------------------------------------------------------------------------- verbs


async def listing(spec: BucketSpec[R], *, bus_wait_s: float | None = None) -> list[R]:
    bus = await connect(load_settings(), wait_s=bus_wait_s)
    try:
        return list((await read_bucket(bus, spec)).values())
    finally:
        await bus.close()


def job_rows(records: Iterable[JobRecord]) -> list[dict[str, Any]]:
    return [{
        "job": r.id, "status": r.status, "attempt": r.attempt,
        "retry": f"{r.retries}/{r.spec.max_retry}",  # failed attempts of those allowed
        "workers": f"{r.spec.workers}x{r.spec.gpus_per_worker}",
        "priority": r.spec.priority, "workspace": r.spec.workspace,
        "nodes": r.nodes or (r.last_nodes if r.status != "pending" else []),
        "position": r.position if r.status == "pending" else None,
        "reason": r.reason, "code": r.code, "retries": r.retries, "max_retry": r.spec.max_retry,
        "run_s": round(r.run_s, 1),
    } for r in sorted(records, key=lambda r: r.submitted_at)]


def node_rows(records: Iterable[NodeRecord]) -> list[dict[str, Any]]:
    return [{
        "node": r.name, "state": r.state, "cordoned": r.cordoned,
        "degraded": r.degraded,
        # as kubectl shows it: the state, then what qualifies it
        "status": r.state + (",degraded" if r.degraded else "") + (",cordoned" if r.cordoned
                                                                     else ""),
        "ip": r.spec.ip, "gpu_model": r.spec.gpu_model,
        "gpus": r.spec.gpu_count, "rack": r.spec.rack, "pool": r.spec.pool,
        "switch": r.spec.switch, "reason": r.reason,
    } for r in sorted(records, key=lambda r: r.name)]


# verb -> (columns, -o wide adds, the id column)
TABLES: dict[str, tuple[list[str], list[str], str]] = {
    "jobs": (["job", "status", "attempt", "retry", "workers", "nodes", "reason"],
             ["priority", "workspace", "position", "code", "run_s"], "job"),
    "nodes": (["node", "status", "gpus", "gpu_model", "rack", "reason"],
              ["ip", "pool", "switch"], "node"),
    "faults": (["fault_id", "key", "kind", "status", "jobs"], ["scope", "reason"], "fault_id"),
}


def table_rows(verb: str, *, bus_wait_s: float | None = None) -> list[dict[str, Any]]:
    if verb == "jobs":
        return job_rows(asyncio.run(listing(JOBS, bus_wait_s=bus_wait_s)))
    if verb == "nodes":
        return node_rows(asyncio.run(listing(NODES, bus_wait_s=bus_wait_s)))
    faults = sorted(asyncio.run(listing(FAULTS, bus_wait_s=bus_wait_s)),
                    key=lambda f: f.opened_at)
    return [r.model_dump(mode="json", exclude={"version"}) for r in faults]


def show_table(args: argparse.Namespace) -> int:
    columns, wide, name = TABLES[args.verb]

    def render() -> str:
        # A watch shows an outage in place of its table and tries again
        # every interval: it never waits for the bus inside one round.
        rows = table_rows(args.verb, bus_wait_s=0)
        return format_table(rows, [*columns, *wide] if args.output == "wide" else columns) \
            if rows else f"No {args.verb} found."

    if args.watch and not (args.json or args.output in ("json", "name")):
        return watch(render, args.interval)
    print_rows(table_rows(args.verb), args.json, columns, args.verb, output=args.output,
               wide=wide, name=name)
    return 0


async def health(service: str, node: str | None) -> dict[str, Any]:
    from libs.service import health_subject

    bus = await connect(load_settings())
    try:
        return await bus.request(health_subject(service, node), timeout_s=3)
    finally:
        await bus.close()


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="primus-safe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)

    up = sub.add_parser("up", help="run the embedded stack in the foreground")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--state-dir", default=None, help="default: PRIMUS_STATE_DIR or .primus")
    up.add_argument("--nats-cluster", type=int, choices=(1, 3, 5), default=1, metavar="N",
                    help="nats-servers: 1 (default), or a cluster of 3 or 5 on loopback "
                    "with every stream and bucket at 3 replicas")
    up.add_argument("--onboarding-level", choices=("quick", "standard", "full"),
                    default="quick", help="the bench new nodes pass (default quick: the "
                    "local nodes share this machine's CPU; a cluster's default is standard)")
    demo = sub.add_parser("demo", help="up + onboard + train + inject a fault + recover")
    demo.add_argument("--nodes", type=int, default=5)
    demo.add_argument("--job", default="examples/job.yaml", help="the job using the SDK")
    demo.add_argument("--unmodified-job", default="examples/unmodified/job.yaml",
                      help="the job without Primus-SaFE code; one of its nodes is killed")
    demo.add_argument("--state-dir", default=None)
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")

    for verb in SERVICE_VERBS:
        s = sub.add_parser(verb, help=f"run the {verb} service")
        if verb == "bootstrap":
            from cli import bootstrap_verbs

            s.add_argument("--hosts", help="hosts.yaml (or PRIMUS_HOSTS_FILE)")
            bootstrap_verbs.add_arguments(s)
        if verb == "bench-agent":
            s.add_argument("--node", help="this node's name (or PRIMUS_NODE_NAME)")
        if verb == "failover":
            s.add_argument("action", nargs="?", choices=["history"],
                           help="history: every recovery and its timings (else run the service)")
            s.add_argument("--json", action="store_true")

    s = sub.add_parser("submit", help="queue a job; prints its id")
    s.add_argument("file")
    job_verbs.add_parsers(sub)
    node_verbs.add_parsers(sub)
    for verb in TABLES:
        add_output_flags(sub.add_parser(verb, help=f"the {verb} table"))
    logs_verb.add_parser(sub)
    s = sub.add_parser("explain", help="why a job is pending, where it runs")
    s.add_argument("job")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("health", help="ask a service whether it is healthy (exit 0 if so)")
    s.add_argument("service")
    s.add_argument("--node")
    s.add_argument("--here", action="store_true",
                   help="ask the replica on this host (a pod's own probe), not any replica")

    bench_p = sub.add_parser("bench", help="node benchmarks and the fleet table")
    bsub = bench_p.add_subparsers(dest="bench_verb", required=True)
    s = bsub.add_parser("run", help="ask a node's agent to benchmark it and wait for the result")
    s.add_argument("--node", required=True)
    s.add_argument("--level", choices=["quick", "standard", "full"], default="quick")
    s.add_argument("--timeout", type=float, default=300)
    s.add_argument("--force", action="store_true", help="bench it even if it runs a job")
    s.add_argument("--json", action="store_true")
    s = bsub.add_parser("report", help="every node's figures against its GPU model's median")
    s.add_argument("--json", action="store_true")
    from cli import bench_verbs
    bench_verbs.add_parsers(bsub)

    lens_verbs.add_parser(sub)
    return p


def check_names(args: argparse.Namespace) -> None:
    """Node names and job ids typed on the command line become NATS subject
    tokens and bucket keys: a bad one is the user's error, named as such,
    never a traceback from deep inside a verb."""
    checks = [("node", "node name")]
    if args.verb in ("explain", "lens", "logs", *job_verbs.VERBS):
        checks.append(("job", "job id"))
    for attr, what in checks:
        value = getattr(args, attr, None)
        if isinstance(value, str):
            try:
                check_key(value, what)
            except ValueError as exc:
                raise CliError(str(exc)) from None


def dispatch(args: argparse.Namespace) -> int:
    check_names(args)
    if args.verb == "bootstrap" and args.action:
        from cli import bootstrap_verbs

        return bootstrap_verbs.run(args)
    if args.verb in SERVICE_VERBS and getattr(args, "action", None) is None:
        return run_service_verb(args)
    if args.verb in ("up", "demo"):
        from cli import stack_verbs

        return stack_verbs.up(args) if args.verb == "up" else stack_verbs.demo(args)
    if args.verb == "submit":
        print(asyncio.run(submit(args.file)))
        return 0
    if args.verb in job_verbs.VERBS:
        return job_verbs.run(args)
    if args.verb in ("node", "fault"):
        return node_verbs.run(args)
    if args.verb in TABLES:
        return show_table(args)
    if args.verb == "logs":
        return logs_verb.run(args)
    if args.verb == "explain":
        from cli.explain import describe, explain

        doc = asyncio.run(explain(args.job, load_settings()))
        print(json.dumps(doc, indent=2, default=str) if args.json else describe(doc))
        return 0
    if args.verb == "failover":
        faults = asyncio.run(listing(FAULTS))
        rows = [{**r.model_dump(mode="json", exclude={"version"}), **r.timings()}
                for r in faults if r.failover and r.jobs]
        print_rows(rows, args.json, ["fault_id", "key", "kind", "status", "jobs",
                                     "detection_s", "mitigation_s", "replacement_s",
                                     "first_step_s", "resume_step", "lost_work_s"],
                   "recoveries")
        return 0
    if args.verb == "health":
        node = args.node or (load_settings().node_name if args.service == "bench-agent" else None)
        if args.here and node is None:
            from libs.service import instance_token
            node = instance_token(load_settings())
        try:
            reply = asyncio.run(health(args.service, node))
        except CliError:
            raise
        except Exception as exc:
            raise CliError(f"{args.service} did not answer: {exc!r}") from None
        print(json.dumps(reply))
        return 0 if reply.get("ok") else 1
    if args.verb == "lens":
        return lens_verbs.run(args)
    if args.verb == "bench":
        from cli import bench_verbs

        verbs = {"run": bench_verbs.run, "report": bench_verbs.report,
                 "sweep": bench_verbs.sweep, "search": bench_verbs.search}
        return verbs[args.bench_verb](args)
    raise CliError(f"unknown verb {args.verb}")


def _quiet_stdout() -> None:
    """After a broken pipe (``primus-safe explain J | head``), point stdout at
    /dev/null so the interpreter's final flush cannot fail again; what Python's
    documentation recommends for SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    # stdout is the verb's answer, which scripts read with --json: log lines
    # (a bus reconnecting, a retry) go to stderr, and only warnings and
    # worse. A service verb and `up` configure logging again as services.
    configure("cli", "warning")
    try:
        code = dispatch(build_parser().parse_args(argv))
        sys.stdout.flush()  # a closed pipe shows here, inside the handler
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 141  # what a shell reports for a reader that stopped early (128 + SIGPIPE)
    except (CliError, SpecError) as exc:
        print(f"primus-safe: {exc}", file=sys.stderr)
        return 1
    except nats.errors.Error as exc:
        # The bus failed mid-verb (a request timed out, JetStream lost its
        # quorum): one line, as for any other operator error.
        print(f"primus-safe: the bus failed: {bus_failure(exc)}; is the platform up?",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
