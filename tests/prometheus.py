"""A real Prometheus for tests: Debian's ``prometheus`` (2.42) started on a
free loopback port with a config the test writes, a TSDB in the test's
temp dir, stopped afterwards; ``query`` runs PromQL through its HTTP API.

Where the binary is missing the test is skipped with the reason, except
under CI (``CI=true``), where ``.ci/run`` installs it and a skip would hide
a broken install: there it is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from libs.drivers.local import free_port
from tests.helpers import terminate

INSTALL = "apt-get install -y prometheus"


def prometheus_binary() -> str:
    found = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    if found:
        return found
    reason = f"no prometheus binary on PATH ({INSTALL}, or set PROMETHEUS_BIN)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class Prometheus:
    """One server: ``start(config)``, ``query``, ``targets``, ``stop``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "prometheus.log"

    def start(self, config: dict[str, Any], *, ready_s: float = 60.0) -> Prometheus:
        binary = prometheus_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={path}", f"--web.listen-address=127.0.0.1:{self.port}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", "--web.enable-lifecycle"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: "
                                     f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready in {ready_s}s: {self.log.read_text()[-3000:]}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector: [{"metric": labels, "value": [t, "v"]}]."""
        data = self.api("query", query=promql)
        return data["result"] if data["resultType"] == "vector" else [data]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets", state="active")["activeTargets"]

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 15)
        self.proc = None
