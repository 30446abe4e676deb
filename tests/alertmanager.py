"""A real Alertmanager on loopback for the alert-delivery tests.

The binary is the Debian package's ``prometheus-alertmanager`` (or an
``alertmanager`` on PATH). Without it the tests are skipped with the reason;
under ``CI=true`` a missing binary fails them instead, so CI cannot pass by
skipping. Gossip is off (``--cluster.listen-address=``), the data goes to a
temporary directory, and the only receiver is a null one: the tests read
what Alertmanager holds through its v2 API.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libs.drivers.local import free_port
from tests.helpers import terminate

BINARIES = ("prometheus-alertmanager", "alertmanager")
CONFIG = """route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: "null"
"""


def binary() -> str:
    """The Alertmanager binary; skips (or fails under CI=true) without one."""
    for name in BINARIES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file()
                                       else None)
        if found:
            return found
    reason = ("no Alertmanager binary (prometheus-alertmanager or alertmanager on PATH): "
              "install it with `apt-get install prometheus-alertmanager`")
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: a missing binary is a failure)")
    pytest.skip(reason)


class Alertmanager:
    """A running Alertmanager: its base URL and a small v2 API client."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def api(self, path: str, body: Any = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}/api/v2/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """Alerts it holds (active, silenced and inhibited alike)."""
        query = urllib.parse.urlencode([("filter", f'{k}="{v}"') for k, v in filters.items()])
        return self.api(f"alerts?{query}" if query else "alerts")  # type: ignore[no-any-return]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    exe = binary()
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG)
    log = tmp_path / "alertmanager.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address=", f"--storage.path={tmp_path / 'am-data'}",
             "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"alertmanager did not become ready:\n"
                                     f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        yield Alertmanager(url, proc, log)
    finally:
        terminate(proc)
