"""Alert delivery against real servers: the collector with its alert loop on
a real NATS and the ClickHouse engine, a real Alertmanager on loopback
(``tests/alertmanager.py``) and an in-process webhook receiver.

A Lens alert fires, Alertmanager shows it, then it resolves; a webhook gets
the signed payload once although the first delivery failed; an unreachable
Alertmanager is retried and recorded while the alert is stored and the loop
goes on; a malformed receivers file stops the start; a silence made with
the CLI keeps an alert out of Alertmanager until it is expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from libs.bus import Bus
from libs.drivers.local import free_port
from libs.events import (
    GpuMetrics,
    JobSpec,
    JobSubmitted,
    JobSubmittedData,
    LensAlert,
    LensAlertData,
    NodeTelemetry,
    NodeTelemetryData,
)
from libs.settings import Settings
from libs.specs import SpecError
from services.lens_collector.alerts import AlertConfig, ThresholdRule
from services.lens_collector.app import LensCollector
from services.lens_collector.delivery import SIGNATURE_HEADER, verify_signature
from tests.alertmanager import Alertmanager, alertmanager  # noqa: F401  (a fixture)
from tests.helpers import lens_rows, run_cli, running_collector, until

pytestmark = pytest.mark.timeout(180)

HOT = AlertConfig(gpu_temp_c=ThresholdRule(above=80, clear_below=60), job_hang_s=3600,
                  checkpoint_max_age_s=3600, node_down_s=3600)
JOB_LINK = "https://grafana.example/d/primus-job?var-job={job}"
NODE_LINK = "https://grafana.example/d/primus-node?var-node={node}"
FAST = {"resend_interval_s": 0.5, "silence_refresh_s": 0.2, "dashboard_url": JOB_LINK,
        "node_dashboard_url": NODE_LINK}


def receivers_file(tmp_path: Path, *receivers: dict[str, Any], **options: Any) -> Path:
    path = tmp_path / "receivers.yaml"
    path.write_text(yaml.safe_dump({"receivers": list(receivers), **FAST, **options}))
    return path


def sample(node: str, temps: list[float]) -> NodeTelemetry:
    return NodeTelemetry(source=f"bench-agent/{node}", node=node, time=datetime.now(UTC),
                         data=NodeTelemetryData(cpu_pct=1.0, mem_used_bytes=1, mem_total_bytes=2,
                                                load1=0.1, gpus=[GpuMetrics(index=i, temp_c=t)
                                                                 for i, t in enumerate(temps)]))


@contextlib.asynccontextmanager
async def feeding(bus: Bus, node: str, temps: list[float]) -> AsyncIterator[list[float]]:
    """Samples of ``node`` every 0.25 s with the GPU temperatures in ``temps``
    (change the list to change what is reported)."""
    async def feed() -> None:
        while True:
            await bus.publish(sample(node, list(temps)))
            await asyncio.sleep(0.25)

    task = asyncio.create_task(feed())
    try:
        yield temps
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def alert_event(node: str, *, job: str | None = None, state: str = "open",
                alert_id: str | None = None) -> LensAlert:
    now = datetime.now(UTC)
    alert_id = alert_id or uuid.uuid4().hex[:20]
    return LensAlert(id=f"{alert_id}-{state}", source="lens-collector", node=node, job=job,
                     time=now, data=LensAlertData(
                         alert_id=alert_id, rule="gpu_temp_high", state=state,  # type: ignore[arg-type]
                         severity="critical", subject_key=f"{node}/gpu0", gpu=0, value=91.0,
                         threshold=80.0, message="GPU 0 at 91 C", opened_at=now))


async def deliveries(service: LensCollector, where: str = "1") -> list[dict[str, Any]]:
    columns = ["receiver", "cause", "attempt", "outcome", "status_code", "error", "silence_id",
               "alert_id", "state", "workspace"]
    rows = await service._sql(f"SELECT {', '.join(columns)} FROM {{db}}.alert_deliveries "
                              f"WHERE {where} ORDER BY time, attempt", {})
    return [dict(zip(columns, r, strict=True)) for r in rows]


async def test_a_lens_alert_fires_in_alertmanager_then_resolves(
        alertmanager: Alertmanager, nats_url: str, clickhouse_dsn: str, database: str,  # noqa: F811
        bus: Bus, tmp_path: Path) -> None:
    path = receivers_file(tmp_path, {"name": "am", "kind": "alertmanager",
                                     "url": alertmanager.url})
    async with running_collector(nats_url, clickhouse_dsn, database, alerts=HOT,
                                 alert_interval_s=0.5, alert_receivers=path) as (service, _), \
            feeding(bus, "gpu-hot", [95.0, 40.0]) as temps:
        [shown] = await until(lambda: _alerts(alertmanager, node="gpu-hot"),
                              "the alert in Alertmanager", timeout=40)
        assert shown["labels"] == {"alertname": "gpu_temp_high", "rule": "gpu_temp_high",
                                   "severity": "warning", "node": "gpu-hot", "gpu": "0",
                                   "subject": "gpu-hot/gpu0", "source": "primus-lens"}
        assert shown["generatorURL"] == NODE_LINK.format(node="gpu-hot")
        assert shown["status"]["state"] == "active"
        temps[0] = 30.0  # cooled down: the alert closes and Alertmanager resolves it
        await until(lambda: _gone(alertmanager, node="gpu-hot"), "the alert resolved",
                    timeout=40)
        rows = await until(lambda: _outcomes(service, "delivered", 2), "both deliveries")
        assert {(r["state"], r["attempt"]) for r in rows} == {("open", 1), ("closed", 1)}
        assert service.alerts is not None and service._alert_task is not None
        assert not service._alert_task.done()


async def test_a_webhook_gets_the_signed_payload_once_after_a_failed_delivery(
        nats_url: str, clickhouse_dsn: str, database: str, bus: Bus, tmp_path: Path) -> None:
    got: list[tuple[dict[str, str], bytes, int]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        status = 503 if not got else 204  # the first delivery fails
        got.append((dict(request.headers), body, status))
        return web.Response(status=status, text="busy" if status == 503 else "")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    secret = tmp_path / "hmac"
    secret.write_text("webhook-secret\n")
    path = receivers_file(tmp_path, {
        "name": "ops", "kind": "webhook", "url": f"http://127.0.0.1:{port}/hook",
        "secret": {"file": str(secret)}, "max_attempts": 4,
        "backoff": {"initial_s": 0.3, "jitter": 0}})
    try:
        async with running_collector(nats_url, clickhouse_dsn, database, evaluate_alerts=False,
                                     alert_receivers=path) as (service, _):
            spec = JobSpec(name="train", workers=1, gpus_per_worker=1, command=["true"],
                           workspace="research")
            await bus.publish(JobSubmitted(source="cli", job="train-7b",
                                           data=JobSubmittedData(spec=spec)))
            await until(lambda: lens_rows(bus, "events", job="train-7b"), "job.submitted stored")
            event = alert_event("gpu-9", job="train-7b")
            await bus.publish(event)
            await until(lambda: _ready(len([g for g in got if g[2] == 204]) == 1),
                        "the webhook's delivery", timeout=30)
            await asyncio.sleep(1.0)  # nothing more comes
            assert [g[2] for g in got] == [503, 204]
            (first, _, _), (headers, body, _) = got
            assert first["X-Primus-Delivery"] == headers["X-Primus-Delivery"]
            assert headers["X-Primus-Attempt"] == "2"
            assert verify_signature(b"webhook-secret", body, headers[SIGNATURE_HEADER],
                                    now=datetime.now(UTC).timestamp())
            doc = json.loads(body)
            assert doc["status"] == "firing" and doc["delivery_id"] == headers[
                "X-Primus-Delivery"]
            assert doc["alert"]["workspace"] == "research" and doc["alert"]["job"] == "train-7b"
            assert doc["alert"]["dashboard_url"] == JOB_LINK.format(job="train-7b")
            rows = await deliveries(service)
            assert [(r["attempt"], r["outcome"], r["status_code"]) for r in rows] == [
                (0, "queued", None), (1, "failed", 503), (2, "delivered", 204)]
            assert "HTTP 503: busy" in rows[1]["error"] and rows[2]["workspace"] == "research"
            # The same event again (a redelivery): not sent twice.
            assert service.deliverer is not None
            await service.deliverer.deliver(event)
            await asyncio.sleep(0.5)
            assert len(got) == 2 and len(await deliveries(service)) == 3
            assert service.deliverer.counts["duplicate"] == 1
    finally:
        await runner.cleanup()


async def test_a_webhook_away_for_many_attempts_gets_the_alert_when_it_is_back(
        nats_url: str, clickhouse_dsn: str, database: str, bus: Bus, tmp_path: Path) -> None:
    """No max_attempts (the default): a receiver that is down is tried until
    it answers, so an outage longer than any fixed number of attempts delays
    the alert and loses nothing."""
    got: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.Response(status=204)

    port = free_port()
    secret = tmp_path / "hmac"
    secret.write_text("s")
    path = receivers_file(tmp_path, {
        "name": "ops", "kind": "webhook", "url": f"http://127.0.0.1:{port}/hook",
        "secret": {"file": str(secret)}, "timeout_s": 1,
        "backoff": {"initial_s": 0.1, "max_s": 0.3, "jitter": 0}})
    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    try:
        async with running_collector(nats_url, clickhouse_dsn, database, evaluate_alerts=False,
                                     alert_receivers=path) as (service, _):
            event = alert_event("gpu-away")
            await bus.publish(event)
            await until(lambda: _outcomes(service, "failed", 8), "eight refused attempts",
                        timeout=30)
            await runner.setup()  # the receiver is back
            await web.TCPSite(runner, "127.0.0.1", port).start()
            [done] = await until(lambda: _outcomes(service, "delivered", 1), "the delivery",
                                 timeout=30)
            await asyncio.sleep(1.0)  # nothing more comes
            assert len(got) == 1 and json.loads(got[0])["alert"]["id"] == event.data.alert_id
            chain = await deliveries(service)
            assert chain[0]["outcome"] == "queued" and chain[-1] == done
            assert {r["outcome"] for r in chain[1:-1]} == {"failed"}
            assert done["attempt"] == len(chain) - 1 > 8
            assert not [r for r in chain if r["outcome"] == "gave_up"]
    finally:
        await runner.cleanup()


async def test_an_unreachable_alertmanager_is_retried_recorded_and_the_loop_goes_on(
        nats_url: str, clickhouse_dsn: str, database: str, bus: Bus, tmp_path: Path) -> None:
    path = receivers_file(tmp_path, {
        "name": "am", "kind": "alertmanager", "url": f"http://127.0.0.1:{free_port()}",
        "timeout_s": 1, "max_attempts": 3, "backoff": {"initial_s": 0.1, "jitter": 0}})
    async with running_collector(nats_url, clickhouse_dsn, database, alerts=HOT,
                                 alert_interval_s=0.5, alert_receivers=path) as (service, _), \
            feeding(bus, "gpu-lost", [95.0, 40.0]) as temps:
        rows = await until(lambda: _outcomes(service, "gave_up", 1), "the chain to give up",
                           timeout=40)
        chain = await deliveries(service, f"alert_id = '{rows[0]['alert_id']}' "
                                          "AND cause = 'transition'")
        assert [(r["attempt"], r["outcome"]) for r in chain] == [
            (0, "queued"), (1, "failed"), (2, "failed"), (3, "gave_up")]
        assert all("ClientConnectorError" in r["error"] for r in chain[1:])
        stored = await lens_rows(bus, "alerts", node="gpu-lost")
        assert [a["state"] for a in stored] == ["open"]  # stored as ever
        temps[1] = 97.0  # a second GPU heats up: the loop still evaluates and publishes
        await until(lambda: _outcomes(service, "gave_up", 2), "the second alert's chain",
                    timeout=40)
        assert len(await lens_rows(bus, "alerts", node="gpu-lost")) == 2
        assert service._alert_task is not None and not service._alert_task.done()


async def test_a_malformed_receivers_file_fails_start_up_with_file_field_and_fix(
        tmp_path: Path, nats_url: str) -> None:
    bad = tmp_path / "receivers.yaml"
    bad.write_text("receivers:\n  - {name: ops, kind: webhook, url: 'http://h/hook'}\n"
                   "routes:\n  - {receivers: [pager]}\n")
    with pytest.raises(SpecError) as err:
        LensCollector(Settings(nats_url=nats_url), alert_receivers=bad)
    assert str(bad) in str(err.value) and "receivers.0" in str(err.value)
    assert "add secret:" in str(err.value)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_NATS_URL=nats_url, PRIMUS_LENS_ALERT_RECEIVERS=str(bad),
               PRIMUS_STATE_DIR=str(tmp_path / "state"), PRIMUS_METRICS_PORT="0",
               PRIMUS_CLICKHOUSE_DSN=f"chdb://{tmp_path / 'chdb'}")
    proc = await asyncio.to_thread(run_cli, "lens-collector", env=env, timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert str(bad) in proc.stderr and "field 'receivers.0'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


async def test_a_silenced_alert_is_stored_not_sent_until_the_silence_expires(
        alertmanager: Alertmanager, nats_url: str, clickhouse_dsn: str, database: str,  # noqa: F811
        bus: Bus, tmp_path: Path) -> None:
    am = ["lens", "silence", "--alertmanager", alertmanager.url]
    made = await asyncio.to_thread(
        run_cli, *am, "create", "node=gpu-quiet", "severity=~critical|warning",
        "--duration", "1h", "--comment", "swapping GPU 0", "--author", "ops", "--json")
    assert made.returncode == 0, made.stderr
    silence = json.loads(made.stdout)["id"]
    listed = await asyncio.to_thread(run_cli, *am, "list", "--json")
    [row] = json.loads(listed.stdout)
    assert (row["id"], row["state"], row["comment"], row["author"]) == (
        silence, "active", "swapping GPU 0", "ops")
    assert row["matchers"] == "node=gpu-quiet severity=~critical|warning"
    path = receivers_file(tmp_path, {"name": "am", "kind": "alertmanager",
                                     "url": alertmanager.url})
    async with running_collector(nats_url, clickhouse_dsn, database, evaluate_alerts=False,
                                 alert_receivers=path) as (service, _):
        await bus.publish(alert_event("gpu-quiet"))
        await bus.publish(alert_event("gpu-loud"))  # not silenced: sent
        await until(lambda: _alerts(alertmanager, node="gpu-loud"), "the loud alert")
        rows = await until(lambda: _outcomes(service, "silenced", 2),
                           "the transition and a re-send recorded silenced")
        assert {r["silence_id"] for r in rows} == {silence}
        assert {r["cause"] for r in rows} == {"transition", "resend"}
        await asyncio.sleep(1.0)  # two more re-send intervals
        assert not await _alerts(alertmanager, node="gpu-quiet")
        assert await lens_rows(bus, "alerts", node="gpu-quiet")  # stored all the same
        expired = await asyncio.to_thread(run_cli, *am, "expire", silence)
        assert expired.returncode == 0 and silence in expired.stdout, expired.stderr
        listed = await asyncio.to_thread(run_cli, *am, "list", "--all", "--json")
        assert [r["state"] for r in json.loads(listed.stdout)] == ["expired"]
        # Expired: the next re-send brings the alert to Alertmanager.
        await until(lambda: _alerts(alertmanager, node="gpu-quiet"), "the alert re-sent")
    gone = await asyncio.to_thread(run_cli, *am, "expire", "no-such-id")
    assert gone.returncode == 1 and "HTTP" in gone.stderr and "\n" not in gone.stderr.strip()


def test_silence_verbs_say_so_when_alertmanager_is_away(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_STATE_DIR"] = str(tmp_path)
    away = run_cli("lens", "silence", "--alertmanager", f"http://127.0.0.1:{free_port()}",
                   "list", env=env)
    assert away.returncode == 1 and "unreachable" in away.stderr
    none = run_cli("lens", "silence", "list", env=env)
    assert none.returncode == 1 and "--alertmanager URL" in none.stderr
    bad = run_cli("lens", "silence", "--alertmanager", "http://127.0.0.1:1", "create",
                  "node", env=env)
    assert bad.returncode == 1 and "name=value" in bad.stderr
    assert sys.executable  # the CLI ran under this interpreter (tests.helpers.run_cli)


# --------------------------------------------------------------------------- helpers


async def _ready(value: bool) -> bool:
    return value


async def _alerts(am: Alertmanager, **filters: str) -> list[dict[str, Any]]:
    return await asyncio.to_thread(am.alerts, **filters)


async def _gone(am: Alertmanager, **filters: str) -> bool:
    return not await _alerts(am, **filters)


async def _outcomes(service: LensCollector, outcome: str, count: int) -> list[dict[str, Any]]:
    rows = await deliveries(service, f"outcome = '{outcome}'")
    return rows if len(rows) >= count else []
