"""``primus-safe bootstrap plan|apply HOSTS.yaml``: render a hosts file into
a Kubespray inventory and add-on Helm values, show what would change, and
provision through ansible-runner.

Kept out of cli/main.py so the service runner (``primus-safe bootstrap
--hosts FILE``) and these operator verbs share one verb without one file
growing. Every check (the hosts file, the Kubespray checkout) runs before the
first write: bad input never half-applies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from cli.client import CliError
from libs.inventory import HostsFile
from libs.specs import load_model

ACTIONS = ("plan", "apply")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=ACTIONS,
                        help="plan: show what would change; apply: write and provision "
                        "(without an action: run the bootstrap service)")
    parser.add_argument("hosts_file", nargs="?", metavar="HOSTS.yaml")
    parser.add_argument("--kubespray", metavar="DIR",
                        help="apply: a Kubespray checkout; runs its playbook through "
                        "ansible-runner (without it, apply only writes the files)")
    parser.add_argument("--playbook", default="cluster.yml",
                        help="playbook inside --kubespray (default cluster.yml)")
    parser.add_argument("--out", default=".primus/bootstrap",
                        help="where inventory/<cluster>/ is rendered (default .primus/bootstrap)")
    parser.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE",
                        help="apply: an extra variable for the playbook (repeatable)")
    parser.add_argument("--publish", action="store_true",
                        help="apply: tell the running bootstrap service each node's "
                        "provisioning result (node.provisioned), which gates its preflight")
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
    from services.bootstrap.plan import as_json, describe
    from services.bootstrap.provision import plan_for, record_applied, run_playbook, write_files

    if args.hosts or not args.hosts_file:
        raise CliError(f"bootstrap {args.action} needs a hosts file: "
                       f"primus-safe bootstrap {args.action} HOSTS.yaml")
    hosts = load_model(args.hosts_file, HostsFile)  # every problem at once, before any effect
    extravars = _extravars(args.extra_var)
    kubespray = Path(args.kubespray) if args.kubespray else None
    if args.action == "apply" and kubespray is not None:
        if not (kubespray / args.playbook).is_file():
            raise CliError(f"--kubespray {kubespray}: no {args.playbook} there; "
                           "give the root of a Kubespray checkout")
        if not hosts.provisioned:
            raise CliError(f"{args.hosts_file}: --kubespray given but the file does not ask "
                           "for provisioning; add 'provision: true' (and control-plane/etcd roles)")
    root = Path(args.out)
    plan, files = plan_for(hosts, root)
    print(json.dumps(as_json(plan), indent=2) if args.json else describe(plan), flush=True)
    if args.action == "plan":
        return 0
    write_files(root, plan, files)
    if kubespray is not None and not plan.empty:
        result = run_playbook(project_dir=kubespray, playbook=args.playbook,
                              inventory=root / "inventory" / hosts.cluster / "hosts.yaml",
                              on_progress=lambda p: print(p, flush=True), extravars=extravars)
        if args.publish:
            asyncio.run(_publish(hosts, ok=result.ok_hosts, failed=result.failed_hosts,
                                 status=result.status))
        if result.rc != 0:
            failed = ", ".join(result.failed_hosts) or "see the output above"
            raise CliError(f"provisioning failed ({result.status}, rc {result.rc}) on: {failed}; "
                           "fix and run apply again (Kubespray re-runs idempotently)")
        print(f"provisioned: {', '.join(result.ok_hosts)}")
    where = root / "inventory" / hosts.cluster
    if hosts.provisioned and kubespray is None:
        # Not recorded: the next apply with --kubespray must still provision.
        print(f"wrote the inventory in {where}; provision with --kubespray DIR")
        return 0
    record_applied(hosts, root)
    print(f"applied {hosts.cluster}: inventory in {where}")
    return 0


async def _publish(hosts: HostsFile, *, ok: tuple[str, ...], failed: tuple[str, ...],
                   status: str) -> None:
    """One node.provisioned per node Kubespray touched; ids derive from the
    node's description so a re-run with the same outcome is de-duplicated."""
    from cli.client import connect
    from cli.output import load_settings
    from libs.events import NodeProvisioned, NodeProvisionedData
    from services.bootstrap.app import registration_id

    specs = {h.name: h for h in hosts.nodes}
    bus = await connect(load_settings())
    try:
        for name, good in [(n, True) for n in ok] + [(n, False) for n in failed]:
            if name not in specs:
                continue
            await bus.publish(NodeProvisioned(
                id=f"prov-{registration_id(specs[name])}-{'ok' if good else 'failed'}",
                source="cli", node=name,
                data=NodeProvisionedData(ok=good, reason="" if good else f"kubespray {status}"),
            ))
    finally:
        await bus.close()
