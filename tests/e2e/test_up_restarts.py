"""Restarting the whole embedded stack quarantines no healthy node.

`primus-safe up --nodes 2` is started and stopped three times in one state
directory. Each start, failover replays every heartbeat stored so far
(stamped seconds to minutes ago) while the node agents are still starting;
before failover judged on its own clock with a deadline after its start,
2 of 6 such restarts quarantined a healthy node. Here every round must end
with both nodes ready and no fault ever opened. (The mechanism itself is
restarted six times, with slow agents and skewed clocks, in
``tests/failover/test_failover_time.py``; this test proves the whole stack.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROUNDS = 3  # the mechanism's own test restarts failover more often


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"no {text!r} from up:\n" + log.read_text(errors="replace")[-3000:])


def test_stack_restarts_quarantine_no_healthy_node(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env["PRIMUS_STATE_DIR"] = str(tmp_path / "state")
    for round_ in range(ROUNDS):
        log = tmp_path / f"up-{round_}.log"
        with log.open("wb") as out:
            up = subprocess.Popen([sys.executable, "-m", "cli.main", "up", "--nodes", "2"],
                                  env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            _wait_for(log, "nodes ready", up, timeout=120)
            time.sleep(4)  # longer than a heartbeat deadline (3 x 1 s)
            faults = run_cli("faults", "--json", env=env)
            nodes = run_cli("nodes", "--json", env=env)
            assert faults.returncode == 0 and nodes.returncode == 0, faults.stderr + nodes.stderr
            assert json.loads(faults.stdout) == [], f"round {round_}: {faults.stdout}"
            states = {n["node"]: n["state"] for n in json.loads(nodes.stdout)}
            assert states == {"node-1": "ready", "node-2": "ready"}, (round_, states)
        finally:
            up.send_signal(signal.SIGTERM)
            assert up.wait(60) == 0, log.read_text(errors="replace")[-3000:]
