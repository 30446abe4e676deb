"""docker-compose.yml's NATS on a real nats-server: its config (as Compose
interpolates it, with the issuer file written by the ``nats-callout-issuer``
container's own command) starts; the services' ``platform`` login works and
declares the topology; a client without credentials is refused; a training
worker's job credential is let in by the scheduler's auth callout (with the
compose file's default keys) and may publish only its own job's telemetry.
No Docker is needed: only the paths are this machine's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import yaml
from deploy_helpers import REPO, interpolate

from libs.bus import Bus
from libs.drivers.local import free_port
from libs.embedded import nats_server_binary, wait_for_port
from libs.events import JobSpec
from libs.job_credentials import credential
from libs.records import JOBS, JobRecord
from libs.sdk import job_inbox
from libs.settings import Settings
from services.scheduler.callout import AuthCallout


def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def env_default(service: dict[str, Any], name: str) -> str:
    return interpolate(service["environment"][name])


def test_the_compose_nats_config_works_for_real(tmp_path: Path) -> None:
    doc = compose()
    services = doc["services"]
    # The issuer container's own command, writing where nats mounts it.
    issuer = services["nats-callout-issuer"]
    seed = env_default(issuer, "PRIMUS_NATS_CALLOUT_SEED")
    (tmp_path / "auth").mkdir()
    code = issuer["entrypoint"][2].replace("/run/nats-auth", str(tmp_path / "auth"))
    assert issuer["entrypoint"][:2] == ["python", "-c"]
    assert issuer["volumes"] == ["nats-auth:/run/nats-auth"]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PRIMUS_NATS_CALLOUT_SEED": seed})
    # nats reads it beside its config (an include is relative to the file).
    assert "nats-auth:/etc/nats/auth:ro" in services["nats"]["volumes"]
    assert services["nats"]["configs"] == [{"source": "nats-conf",
                                            "target": "/etc/nats/nats.conf"}]
    port = free_port()
    conf = (interpolate(doc["configs"]["nats-conf"]["content"])
            .replace("store_dir: /data", f"store_dir: {json.dumps(str(tmp_path / 'js'))}")
            .replace("port: 4222", f"port: {port}").replace("http_port: 8222\n", ""))
    assert "no_auth_user" not in conf and "token" not in conf
    (tmp_path / "nats.conf").write_text(conf)
    password = env_default(services["nats"], "PRIMUS_NATS_PASSWORD")
    log = tmp_path / "nats.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([nats_server_binary(), "-c", str(tmp_path / "nats.conf")],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PRIMUS_NATS_PASSWORD": password})
    try:
        try:
            wait_for_port(port)
        except TimeoutError:
            pytest.fail(log.read_text()[-2000:])
        scheduler = services["scheduler"]
        settings = Settings(
            job_credential_key=env_default(scheduler, "PRIMUS_JOB_CREDENTIAL_KEY"),  # type: ignore[arg-type]
            nats_callout_seed=env_default(scheduler, "PRIMUS_NATS_CALLOUT_SEED"))  # type: ignore[arg-type]
        asyncio.run(_check(f"nats://127.0.0.1:{port}", password, settings))
    finally:
        proc.terminate()
        proc.wait(10)


async def _check(url: str, password: str, settings: Settings) -> None:
    platform = await Bus.connect(url, "scheduler", user="platform", password=password)
    callout = AuthCallout(settings)
    try:
        await platform.ensure_topology()
        await callout.start(platform)
        jobs = await platform.records(JOBS)
        await jobs.put("ja", JobRecord(id="ja", submitted_at=0.0, status="running",
                                       spec=JobSpec(name="ja", workers=1, command=["x"])))
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, connect_timeout=2, allow_reconnect=False)  # no credentials
        key = settings.job_credential_key
        assert key is not None
        cred = credential(key.get_secret_value().encode(), "ja")
        worker = await nats.connect(url, user=cred.user, password=cred.password,
                                    inbox_prefix=job_inbox("ja"), allow_reconnect=False)
        try:
            seen: list[str] = []

            async def on(msg: Any) -> None:
                seen.append(msg.subject)

            await platform.nc.subscribe("safe.telemetry.job.*", cb=on)
            await platform.flush()
            await worker.publish("safe.telemetry.job.ja", b"{}")
            await worker.publish("safe.telemetry.job.jb", b"{}")  # another job's: refused
            await worker.flush()
            await asyncio.sleep(0.5)
            assert seen == ["safe.telemetry.job.ja"]
        finally:
            await worker.close()
    finally:
        await callout.stop()
        await platform.close()
