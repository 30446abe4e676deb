"""The operator's Prometheus scrapes the embedded stack: a real Prometheus
reads the stack's file_sd targets (every service and both agents), and
PromQL finds the GPUs of a running job by its id and rank, under AMD
device-metrics-exporter's names, beside every service's own figures.

The agents' GPU tool is a stand-in ``amd-smi`` that prints a recorded real
``amd-smi metric --json`` / ``static --json`` (tests/gpu/fixtures, Radeon
RX 6600): the same parser and sampler as on a real node.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.embedded import SCRAPE_TARGETS, EmbeddedStack
from tests.helpers import ROOT, bucket, run_cli, stack_cli_env, until
from tests.prometheus import Prometheus, prometheus_binary

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
FIXTURES = ROOT / "tests" / "gpu" / "fixtures"
PROM_DASHBOARD = ROOT / "deploy" / "helm" / "primus-safe" / "dashboards" / \
    "gpu-overview-prometheus.json"
SERVICES = {"lens-collector", "scheduler", "failover", "bench-coordinator", "bootstrap"}


def grafana_vars(expr: str, variables: dict[str, str]) -> str:
    """Grafana's variables in PromQL, expanded as Grafana does for a
    multi-value variable set to All (its ``allValue`` regex)."""
    expr = expr.replace("$__rate_interval", "20s").replace("$__interval", "5s")
    for name, value in variables.items():
        expr = re.sub(rf"\$\{{{name}(?::\w+)?\}}|\${name}\b", value, expr)
    assert "$" not in expr.replace("$1", ""), f"unexpanded variable in: {expr}"
    return expr


def dashboard_queries(prom: Prometheus) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the Prometheus dashboard, its
    variables set to All; each variable's own query must find values."""
    doc = json.loads(PROM_DASHBOARD.read_text())
    variables = {}
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
        assert found, var
        series = prom.api("series", **{"match[]": found.group(1)})
        assert any(found.group(2) in s for s in series), var["name"]
        variables[var["name"]] = var["allValue"]
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], grafana_vars(target["expr"], variables)))
    assert len(out) >= 10
    return out


def fake_amd_smi(bin_dir: Path) -> None:
    """``amd-smi metric|static --json`` from the recorded outputs; anything
    else (xgmi, version) fails as on a card without it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "amd-smi"
    tool.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"files = {{'metric': {str(FIXTURES / 'amd_smi_metric_rx6600.json')!r},\n"
        f"         'static': {str(FIXTURES / 'amd_smi_static_rx6600.json')!r}}}\n"
        "if len(sys.argv) > 1 and sys.argv[1] in files and '--json' in sys.argv:\n"
        "    sys.stdout.write(open(files[sys.argv[1]]).read())\n"
        "    sys.exit(0)\n"
        "sys.exit(2)\n")
    tool.chmod(0o755)


def test_prometheus_scrapes_every_service_and_the_gpus_of_a_job(tmp_path: Path) -> None:
    prometheus_binary()  # skip (or fail under CI) before starting anything
    fake_amd_smi(tmp_path / "bin")
    stack = EmbeddedStack(tmp_path / "stack", nodes=2, env={
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}).start()
    prom = Prometheus(tmp_path / "prometheus")
    try:
        prom.start({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "primus", "scrape_timeout": "1s",
                "file_sd_configs": [{"files": [str(stack.state_dir / SCRAPE_TARGETS)]}]}]})
        asyncio.run(_scraped(stack, prom, tmp_path))
    finally:
        prom.stop()
        codes = stack.stop()
    assert codes == dict.fromkeys(codes, 0), f"unclean exits: {codes}; {stack.stragglers}"


async def _scraped(stack: EmbeddedStack, prom: Prometheus, tmp_path: Path) -> None:
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "e2e", token=stack.nats.token)
    env = stack_cli_env(stack.state_dir)
    try:
        async def ready() -> bool:
            nodes = await bucket(bus, "nodes")
            return len(nodes) == 2 and all(n["state"] == "ready" for n in nodes.values())

        await until(ready, "both nodes ready", timeout=180)
        job_file = tmp_path / "job.yaml"
        job_file.write_text("name: scraped\nworkers: 2\ngpus_per_worker: 1\n"
                            "command: [python, -c, 'import time; time.sleep(300)']\n"
                            f"workdir: {ROOT}\n")
        submitted = await asyncio.to_thread(run_cli, "submit", str(job_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()

        # Every target is up: five services and two agents.
        def all_up() -> list[dict[str, object]] | None:
            targets = prom.targets()
            up = [t for t in targets if t["health"] == "up"]
            return targets if len(targets) == 7 and len(up) == 7 else None

        targets = await until(lambda: asyncio.to_thread(all_up), "7 targets up", timeout=60)
        assert {t["labels"]["service"] for t in targets} == SERVICES | {"bench-agent"}
        info = prom.query("primus_service_info")
        assert {s["metric"]["service"] for s in info} == SERVICES | {"bench-agent"}

        # The job's GPUs, by its id, one per rank, on the two nodes.
        def job_gpus() -> list[dict[str, object]] | None:
            rows = prom.query(f'gpu_gfx_activity{{job_id="{job}"}}')
            return rows if len(rows) == 2 else None

        gpus = await until(lambda: asyncio.to_thread(job_gpus), "the job's GPU series",
                           timeout=90)
        labels = [g["metric"] for g in gpus]  # type: ignore[index]
        assert {lb["rank"] for lb in labels} == {"0", "1"}
        assert {lb["hostname"] for lb in labels} == {"node-1", "node-2"}
        assert all(lb["gpu_id"] == "0" for lb in labels)
        # This card's amd-smi says "N/A" for its serial: an empty label, which
        # Prometheus drops (the MI210 recording's serial: test_bench_metrics_page).
        assert all(lb["card_model"].startswith("Navi 23") for lb in labels), labels
        temps = prom.query(f'gpu_junction_temperature{{job_id="{job}"}}')
        assert len(temps) == 2 and all(0 < float(t["value"][1]) < 120 for t in temps)

        # The services' own figures: decisions, stored rows, handled messages.
        seen: dict[str, object] = {}

        def figures() -> bool:
            placed = prom.query("sum(primus_scheduler_placements_total)")
            rows = prom.query('sum(primus_lens_rows_stored_total{table="ingest_node"})')
            handled = prom.query("sum by (service) (primus_messages_handled_total)")
            seen.update(placed=placed, rows=rows,
                        handled={h["metric"].get("service") for h in handled})
            return bool(placed and float(placed[0]["value"][1]) >= 1 and rows
                        and float(rows[0]["value"][1]) > 0
                        and {"lens-collector", "scheduler", "failover"} <= seen["handled"])

        try:
            await until(lambda: asyncio.to_thread(figures), "the services' figures", timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}") from None
        queue = prom.query("primus_scheduler_leader")
        assert [float(q["value"][1]) for q in queue] == [1.0]

        # Each service's domain figures, by their values: both nodes ready in
        # bootstrap and in the scheduler's view, both agents' onboarding bench
        # healthy (the embedded stack onboards with the quick level, which the
        # agent judges itself), the collector's insert latency and batch sizes,
        # the scheduler's cycles.
        def value(expr: str) -> float:
            rows = prom.query(expr)
            return float(rows[0]["value"][1]) if rows else 0.0

        def domain() -> dict[str, float]:
            got = {expr: value(expr) for expr in (
                'primus_bootstrap_nodes{state="ready"}',
                'primus_scheduler_nodes{state="ready"}',
                'sum(primus_bench_results_total{outcome="healthy"})',
                'sum(primus_lens_store_seconds_count{kind="telemetry"})',
                "sum(primus_lens_telemetry_batch_messages_count)",
                "sum(primus_lens_telemetry_batch_messages_sum)",
                "sum(primus_scheduler_cycle_seconds_count)")}
            seen.update(domain=got)
            return got

        def domain_figures() -> bool:
            got = domain()
            return got['primus_bootstrap_nodes{state="ready"}'] == 2 \
                and got['primus_scheduler_nodes{state="ready"}'] == 2 \
                and got['sum(primus_bench_results_total{outcome="healthy"})'] >= 2 \
                and all(v > 0 for v in got.values())

        try:
            await until(lambda: asyncio.to_thread(domain_figures), "the domain figures",
                        timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen.get('domain')}") from None
        # A batch holds at least one message: its size sum is at least its count.
        got = domain()
        assert got["sum(primus_lens_telemetry_batch_messages_sum)"] >= \
            got["sum(primus_lens_telemetry_batch_messages_count)"]

        # The Prometheus dashboard: every panel's PromQL, as Grafana sends it,
        # returns series from this Prometheus (rates need a few scrapes).
        def empty_panels() -> list[str]:
            return [f"{title}: {expr}" for title, expr in dashboard_queries(prom)
                    if not prom.query(expr)]

        async def dashboard_filled() -> bool:
            return not await asyncio.to_thread(empty_panels)

        try:
            await until(dashboard_filled, "every dashboard panel to have data", timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {await asyncio.to_thread(empty_panels)}") from None
    finally:
        await bus.close()
