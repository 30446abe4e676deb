"""``primus-safe bootstrap plan|apply HOSTS.yaml``: render a hosts file into
a Kubespray inventory for the release of ``--kubespray DIR`` (refusing one
the renderer does not support, and what that release would refuse), show
what would change, and provision through ansible-runner with Kubespray's
own Ansible (``services/bootstrap/ansible_env.py``).

``plan`` compares the file with the nodes the running bootstrap service knows
(its ``nodes`` bucket) when the bus answers, else with the last applied file,
and says which. ``apply --kubespray DIR`` runs only what the change needs:
for a node that leaves, bootstrap drains it (the scheduler moves its jobs
away), then Kubespray's remove-node.yml runs, and only then bootstrap emits
node.removed; new workers join through scale.yml limited to them; a new
cluster, a cluster-setting change or a new control-plane/etcd node runs the
full cluster.yml.

Kept out of cli/main.py so the service runner (``primus-safe bootstrap
--hosts FILE``) and these operator verbs share one verb without one file
growing. Every check (the hosts file, the Kubespray checkout and the
playbooks the change needs, a reachable bootstrap for drains) runs before
the first effect: bad input never half-applies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.client import CliError
from cli.routes import ROUTES as CLI_ROUTES
from libs.inventory import HostsFile, HostSpec
from libs.specs import load_model

if TYPE_CHECKING:
    from libs.bus import Bus
    from libs.kubespray import KubesprayRelease
    from services.bootstrap.ansible_env import AnsibleEnv
    from services.bootstrap.handover import LiveNodes
    from services.bootstrap.plan import Plan
    from services.bootstrap.provision import ProvisionResult
    from services.bootstrap.steps import Step

ACTIONS = ("plan", "apply")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS,
                        help="plan: show what would change; apply: write and provision "
                        "(without an action: run the bootstrap service)")
    parser.add_argument("hosts_file", nargs="?", metavar="HOSTS.yaml")
    parser.add_argument("--kubespray", metavar="DIR",
                        help="a Kubespray checkout of a supported release: the inventory is "
                        "rendered and checked for it; apply runs its playbooks through "
                        "ansible-runner (without it: rendered for the newest supported "
                        "release, and apply only writes the files)")
    parser.add_argument("--ansible-venv", metavar="DIR",
                        help="apply: the virtual environment holding Kubespray's Ansible "
                        "(default: one built once per checkout from its requirements.txt)")
    parser.add_argument("--allow-first-control-plane-change", action="store_true",
                        help="let the first control-plane node change (Kubespray's "
                        "'Replacing a first control plane node' procedure)")
    parser.add_argument("--allow-dns-domain-change", action="store_true",
                        help="let a built cluster's DNS domain change (a rebuild)")
    parser.add_argument("--playbook", default="cluster.yml",
                        help="the full playbook inside --kubespray (default cluster.yml)")
    parser.add_argument("--out", default=".primus/bootstrap",
                        help="where inventory/<cluster>/ is rendered (default .primus/bootstrap)")
    parser.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE",
                        help="apply: an extra variable for every playbook (repeatable; "
                        "wins over the ones apply sets)")
    parser.add_argument("--publish", action="store_true",
                        help="apply: tell the running bootstrap service each node's "
                        "provisioning result (node.provisioned), which gates its preflight")
    parser.add_argument("--no-drain", action="store_true",
                        help="apply: remove nodes without asking the platform to move their "
                        "jobs away (only when none can run there, e.g. the platform is down)")
    parser.add_argument("--drain-timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="apply: how long to wait for removed nodes to drain (default 3600)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def _extravars(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--extra-var {pair!r}: write KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    if args.hosts or not args.hosts_file:
        raise CliError(f"bootstrap {args.action} needs a hosts file: "
                       f"primus-safe bootstrap {args.action} HOSTS.yaml")
    kubespray = Path(args.kubespray) if args.kubespray else None
    release = _release(kubespray)
    # Every problem at once, the release's own rules included, before any effect.
    hosts = load_model(args.hosts_file, HostsFile, context={"kubespray": release})
    extravars = _extravars(args.extra_var)
    if args.ansible_venv and kubespray is None:
        raise CliError("--ansible-venv runs Kubespray's playbooks: give --kubespray DIR too")
    if args.action == "apply" and kubespray is not None:
        if not (kubespray / args.playbook).is_file():
            raise CliError(f"--kubespray {kubespray}: no {args.playbook} there; "
                           "give the root of a Kubespray checkout")
        if not hosts.provisioned:
            raise CliError(f"{args.hosts_file}: --kubespray given but the file does not ask "
                           "for provisioning; add 'provision: true' (and control-plane/etcd roles)")
    return asyncio.run(_run(args, hosts, extravars, kubespray, release))


def _release(kubespray: Path | None) -> KubesprayRelease:
    """The release of the checkout given, else the newest supported one."""
    from libs.kubespray import UnsupportedRelease, newest
    from services.bootstrap.kubespray_checkout import read_release

    if kubespray is None:
        return newest()
    try:
        return read_release(kubespray)
    except UnsupportedRelease as exc:
        raise CliError(str(exc)) from None


def _allowed(args: argparse.Namespace) -> list[str]:
    from services.bootstrap.plan import DNS_DOMAIN_FLAG, FIRST_CONTROL_PLANE_FLAG

    return [flag for flag, given in ((FIRST_CONTROL_PLANE_FLAG,
                                      args.allow_first_control_plane_change),
                                     (DNS_DOMAIN_FLAG, args.allow_dns_domain_change)) if given]


async def _run(args: argparse.Namespace, hosts: HostsFile, extravars: dict[str, Any],
               kubespray: Path | None, release: KubesprayRelease) -> int:
    from cli.client import bus_target
    from cli.output import load_settings
    from services.bootstrap.handover import open_bus, read_live
    from services.bootstrap.plan import as_json, describe
    from services.bootstrap.provision import plan_for

    settings = load_settings()
    url, token = bus_target(settings)
    bus = await open_bus(url, token, settings, routes=CLI_ROUTES)
    try:
        live = await read_live(bus, url) if bus is not None else None
        root = Path(args.out)
        try:
            plan, files = plan_for(hosts, root, live=live.specs if live is not None else None,
                                   release=release)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        baseline = _baseline(bus is not None, live, url, root, hosts)
        target = (f"rendered for {release.name}" + ("" if kubespray is not None else
                  " (the newest supported; --kubespray DIR renders for your checkout)"))
        if args.json:
            print(json.dumps({**as_json(plan), "baseline": baseline, "kubespray": {
                "release": release.version or release.series, "given": kubespray is not None}},
                indent=2), flush=True)
        else:
            print(f"{describe(plan)}\n({baseline['text']}; {target})", flush=True)
        if refused := plan.refused(_allowed(args)):
            raise CliError("refused: " + "; ".join(h.message for h in refused))
        if args.action == "plan":
            return 0
        return await _apply(args, hosts, extravars, kubespray, bus=bus, url=url, live=live,
                            plan=plan, files=files, release=release)
    finally:
        if bus is not None:
            await bus.close()


def _baseline(online: bool, live: LiveNodes | None, url: str, root: Path,
              hosts: HostsFile) -> dict[str, Any]:
    """What the plan was compared with, for the operator and for --json."""
    from services.bootstrap.provision import Workspace

    applied = Workspace(root, hosts.cluster).applied
    last = f"the last applied file {applied}" if applied.is_file() else (
        f"nothing applied yet in {root}: every node is new")
    if live is not None:
        pending = (f", {len(live.pending)} still to provision ({', '.join(live.pending)})"
                   if live.pending else "")
        return {"source": "live", "url": url, "nodes": len(live.records),
                "pending": live.pending,
                "text": f"compared with the live cluster: {len(live.records)} node(s) "
                f"bootstrap knows at {url}{pending}; cluster settings with {last}"}
    why = (f"the bus at {url} has no nodes bucket (bootstrap never ran there)" if online
           else f"offline: no NATS at {url}")
    return {"source": "last-applied" if applied.is_file() else "none", "url": url,
            "text": f"{why}; compared with {last}"}


async def _apply(args: argparse.Namespace, hosts: HostsFile, extravars: dict[str, Any],
                 kubespray: Path | None, *, bus: Bus | None, url: str, live: LiveNodes | None,
                 plan: Plan, files: dict[str, str], release: KubesprayRelease) -> int:
    from services.bootstrap.provision import Workspace, record_applied, write_files
    from services.bootstrap.steps import FACTS_PLAYBOOKS, kubespray_steps

    root = Path(args.out)
    ws = Workspace(root, hosts.cluster)
    where = ws.inventory
    if plan.empty:
        return 0
    if kubespray is None:
        write_files(root, plan, files)
        if hosts.provisioned:
            # Not recorded: the next apply with --kubespray must still provision.
            print(f"wrote the inventory in {where}; provision with --kubespray DIR")
            return 0
        record_applied(hosts, root)
        print(f"applied {hosts.cluster}: inventory in {where}")
        return 0

    # Every check before the first effect.
    cluster_exists = ws.last_applied() is not None or (live is not None and live.provisioned_any())
    facts = next((f for f in FACTS_PLAYBOOKS if (kubespray / f).is_file()), None)
    steps = kubespray_steps(plan, hosts, cluster_exists=cluster_exists,
                            full_playbook=args.playbook, facts_playbook=facts)
    missing = sorted({s.playbook for s in steps if not (kubespray / s.playbook).is_file()})
    if missing:
        raise CliError(f"--kubespray {kubespray}: no {', '.join(missing)} there; this change "
                       "needs it (give the root of a Kubespray checkout)")
    env = await asyncio.to_thread(_ansible_env, args, kubespray, release)
    removed = plan.removed()
    drain = bool(removed) and not args.no_drain
    if drain and bus is None:
        raise CliError(f"removing {', '.join(removed)} needs the bootstrap service to drain "
                       "them first and the bus is not reachable; set PRIMUS_NATS_URL, or pass "
                       "--no-drain if no job can run there")
    if args.publish and bus is None:
        raise CliError(f"--publish needs the bus and nothing answers at {url}; "
                       "set PRIMUS_NATS_URL (or start the stack)")
    leaving = _leaving_specs(removed, live, ws.last_applied())
    if unknown := sorted(set(removed) - {h.name for h in leaving}):
        raise CliError(f"no address known for {', '.join(unknown)} (remove-node.yml needs "
                       "it): neither bootstrap nor the last applied file describes it")
    if bus is not None and not args.no_drain and (drain or args.publish):
        await _hand_over(bus, hosts, required=drain)
    if drain:
        assert bus is not None
        await _wait_drained(bus, removed, timeout_s=args.drain_timeout)

    if removed:
        await _remove_nodes(plan, hosts, leaving, kubespray, extravars, env=env,
                            release=release, bus=bus if drain else None)
        if not drain:
            print(f"note: --no-drain: bootstrap was not told; {', '.join(removed)} stay in its "
                  "nodes bucket until its own hosts file drops them", flush=True)
    write_files(root, plan, files)
    inventory = where / "hosts.yaml"
    joined: ProvisionResult | None = None
    for step in steps:
        if step.kind == "remove":
            continue
        result = await _run_step(kubespray, step, inventory, extravars, env)
        if step.kind in ("scale", "full"):
            joined = result
        if result.rc != 0:
            if args.publish and bus is not None and joined is not None:
                await _publish(bus, hosts, joined)
            failed = ", ".join(result.failed_hosts) or "see the output above"
            raise CliError(f"{step.playbook} failed ({result.status}, rc {result.rc}) on: "
                           f"{failed}; fix and run apply again (Kubespray re-runs idempotently)")
    if joined is not None:
        if args.publish and bus is not None:
            await _publish(bus, hosts, joined)
        print(f"provisioned: {', '.join(joined.ok_hosts)}")
    record_applied(hosts, root)
    print(f"applied {hosts.cluster}: inventory in {where}")
    return 0


def _leaving_specs(removed: list[str], live: LiveNodes | None,
                   last: HostsFile | None) -> list[HostSpec]:
    """The descriptions of the nodes that leave: what bootstrap knows, else
    the last applied file (remove-node.yml needs their address)."""
    known = {h.name: h for h in last.nodes} if last is not None else {}
    if live is not None:
        known |= live.specs
    return [known[n] for n in removed if n in known]


async def _hand_over(bus: Bus, hosts: HostsFile, *, required: bool) -> None:
    from services.bootstrap.handover import hand_over
    from services.bootstrap.protocol import REMOVE_BY_KUBESPRAY

    try:
        changes = await hand_over(bus, hosts, remove_with=REMOVE_BY_KUBESPRAY)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if changes is None:
        if required:
            raise CliError("no bootstrap service answered on the bus; it must drain the "
                           "removed nodes first (start it, or pass --no-drain if no job can "
                           "run there)")
        print("note: no bootstrap service answered; it learns these nodes from its own "
              "hosts file", flush=True)
        return
    for change in changes:
        print(f"bootstrap: {change['action']} {change['node']}", flush=True)


async def _wait_drained(bus: Bus, nodes: list[str], *, timeout_s: float) -> None:
    from services.bootstrap.handover import wait_drained

    def show(node: str, jobs: list[str]) -> None:
        what = f"waiting for {', '.join(jobs)} to move away" if jobs else "waiting for bootstrap"
        print(f"draining {node}: {what}", flush=True)

    try:
        await wait_drained(bus, nodes, timeout_s=timeout_s, on_wait=show)
    except TimeoutError as exc:
        raise CliError(f"{exc}; nothing was removed: run apply again once the jobs are gone "
                       "(or raise --drain-timeout)") from None
    print(f"drained: {', '.join(nodes)}", flush=True)


async def _remove_nodes(plan: Plan, hosts: HostsFile, leaving: list[HostSpec],
                        kubespray: Path, extravars: dict[str, Any], *, env: AnsibleEnv,
                        release: KubesprayRelease, bus: Bus | None) -> None:
    """remove-node.yml for the leaving nodes (with them still in the
    inventory; unreachable ones without a reset), then bootstrap's
    node.removed: it means gone from Kubernetes."""
    from services.bootstrap.handover import ask_remove
    from services.bootstrap.provision import probe_unreachable, write_removal_inventory
    from services.bootstrap.steps import kubespray_steps

    names = plan.removed()
    with tempfile.TemporaryDirectory(prefix="primus-remove-") as tmp:
        inventory = write_removal_inventory(hosts, leaving, Path(tmp), release)
        down = await asyncio.to_thread(probe_unreachable, env=env, inventory=inventory,
                                       nodes=names, extravars=extravars)
        if down:
            print(f"unreachable: {', '.join(down)} (deleted without a reset)", flush=True)
        steps = kubespray_steps(plan, hosts, cluster_exists=True, unreachable=down)
        for step in (s for s in steps if s.kind == "remove"):
            result = await _run_step(kubespray, step, inventory, extravars, env)
            if result.rc != 0:
                raise CliError(f"{step.playbook} failed ({result.status}, rc {result.rc}) for "
                               f"{', '.join(step.nodes)}; nothing was removed from the platform "
                               "(drained nodes stay drained): fix and run apply again")
    if bus is not None:
        try:
            gone = await ask_remove(bus, names, reason="removed by Kubespray remove-node.yml")
        except ValueError as exc:
            raise CliError(str(exc)) from None
        print(f"removed: {', '.join(gone)}", flush=True)


async def _run_step(kubespray: Path, step: Step, inventory: Path,
                    extravars: dict[str, Any], env: AnsibleEnv) -> ProvisionResult:
    from services.bootstrap.provision import run_playbook

    print(f"run: {step.describe()} with {env.playbook}", flush=True)
    return await asyncio.to_thread(
        run_playbook, env=env, project_dir=kubespray, playbook=step.playbook,
        inventory=inventory, on_progress=lambda p: print(p, flush=True), limit=step.limit,
        extravars={**step.extravars, **extravars})


def _ansible_env(args: argparse.Namespace, kubespray: Path,
                 release: KubesprayRelease) -> AnsibleEnv:
    """The operator's --ansible-venv, else the checkout's own environment
    (built on first use, with a progress line per pip step); either is
    checked against the ansible-core range the release accepts."""
    from rich.console import Console

    from services.bootstrap.ansible_env import AnsibleEnv, AnsibleEnvError, env_for

    try:
        if args.ansible_venv:
            env = AnsibleEnv(Path(args.ansible_venv).absolute())
        else:
            console = Console(stderr=True)
            with console.status("Kubespray's Ansible environment") as status:
                env = env_for(kubespray, on_line=lambda line: status.update(line[:120]))
        env.check(release)
    except AnsibleEnvError as exc:
        raise CliError(str(exc)) from None
    return env


async def _publish(bus: Bus, hosts: HostsFile, result: ProvisionResult) -> None:
    """One node.provisioned per node Kubespray touched; ids derive from the
    node's description so a re-run with the same outcome is de-duplicated."""
    from libs.events import NodeProvisioned, NodeProvisionedData
    from services.bootstrap.app import registration_id

    specs = {h.name: h for h in hosts.nodes}
    pairs = [(n, True) for n in result.ok_hosts] + [(n, False) for n in result.failed_hosts]
    for name, good in pairs:
        if name not in specs:
            continue
        await bus.publish(NodeProvisioned(
            id=f"prov-{registration_id(specs[name])}-{'ok' if good else 'failed'}",
            source="cli", node=name,
            data=NodeProvisionedData(ok=good, reason="" if good else f"kubespray {result.status}"),
        ))
