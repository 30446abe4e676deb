"""`primus-safe up` keeps its stack up like a cluster would, on the real
stack (nats-server, five services, two node agents, a real worker):

- a SIGKILLed service, node agent or nats-server is restarted (nats on the
  same port and store), the restart is logged and counted in stack.json, and
  a training worker keeps running through all of it;
- a second `up` in the same directory refuses while the first lives;
- after the first `up` is SIGKILLed, the next one kills what it left behind
  and says "nodes ready" only once its own agents have sent heartbeats;
- SIGTERM stops everything and removes stack.json.

One test, two stack starts: each start costs every agent a torch import."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from libs.bus import Bus
from libs.embedded import STACK_FILE, StackInfo, process_start, read_stack_file
from tests.helpers import ROOT, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]


class Up:
    """`primus-safe up --nodes 2` as a process; its stderr lines, time-stamped."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", "--nodes", "2"], env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.stdout = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for stamp, line in list(self.lines):
                if text in line:
                    return stamp
            if self.proc.poll() is not None and not any(text in x for _, x in self.lines):
                break
            time.sleep(0.2)
        raise AssertionError(f"no {text!r} from up; its stderr:\n" + self.text()[-4000:])

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def stack(state: Path) -> StackInfo:
    info = read_stack_file(state / STACK_FILE)
    assert info is not None
    return info


def wait_until(check, what: str, timeout: float = 60) -> object:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with_value = check()
        if with_value:
            return with_value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    return process_start(pid) is not None


def kill_group(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)


def restarted(state: Path, name: str, old_pid: int) -> StackInfo | None:
    info = read_stack_file(state / STACK_FILE)
    child = info.children.get(name) if info else None
    ok = child is not None and child.pid != old_pid and child.restarts >= 1 and alive(child.pid)
    return info if ok else None


class BeatListener(threading.Thread):
    """Stamps the first heartbeat of each (node, agent pid) on the bus that
    the `up` with ``owner`` pid writes into stack.json."""

    def __init__(self, state: Path, owner: int) -> None:
        super().__init__(daemon=True)
        self.state, self.owner = state, owner
        self.first: dict[tuple[str, int], float] = {}
        self.done = threading.Event()
        self.connected = threading.Event()

    def run(self) -> None:
        asyncio.run(self._listen())

    async def _listen(self) -> None:
        while not self.done.is_set():
            info = read_stack_file(self.state / STACK_FILE) if (
                self.state / STACK_FILE).exists() else None
            if info is not None and info.pid == self.owner:
                break
            await asyncio.sleep(0.05)
        else:
            return
        bus = await Bus.connect(info.nats_url, "test-beats", token=info.nats_token)

        async def on_beat(msg) -> None:  # type: ignore[no-untyped-def]
            event = json.loads(msg.data)
            self.first.setdefault((event["node"], event["data"]["pid"]), time.monotonic())

        await bus.nc.subscribe("safe.live.*.heartbeat", cb=on_beat)
        self.connected.set()
        while not self.done.is_set():
            await asyncio.sleep(0.1)
        await bus.close()


def test_up_restarts_what_dies_owns_its_dir_and_cleans_after_a_dead_owner(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_STATE_DIR=str(state), OMP_NUM_THREADS="1")
    first = Up(env)
    second: Up | None = None
    try:
        first.wait_for("2 nodes ready", 180)
        info = stack(state)
        assert info.pid == first.proc.pid and len(info.nodes) == 2
        assert set(info.children) >= {"nats-server", "scheduler",
                                      *(f"agent-{n}" for n in info.nodes)}, info

        # A second `up` in the same directory refuses, naming the owner.
        again = run_cli("up", "--nodes", "2", env=env, timeout=30)
        assert again.returncode == 1 and again.stdout == ""
        assert f"a stack already runs here ({state.resolve()}): pid {first.proc.pid}" \
            in again.stderr and "Traceback" not in again.stderr
        assert stack(state).pid == first.proc.pid

        # A training worker, on one node; its agent lives, the other node's dies.
        job = tmp_path / "sleepy.yaml"
        job.write_text("name: sleepy\nworkers: 1\ngpus_per_worker: 1\n"
                       "command: [python, -c, 'import time; time.sleep(300)']\n")
        out = run_cli("submit", str(job), env=env, timeout=30)
        assert out.returncode == 0, out.stderr
        pid_files = wait_until(lambda: list((state / "pids").glob("*/[0-9]*")),
                               "the worker to start", 60)
        worker_file = pid_files[0]  # type: ignore[index]
        worker, worker_node = int(worker_file.name), worker_file.parent.name
        other = next(n for n in info.nodes if n != worker_node)

        # A missing executable: exit 127, "command not found", the log shown by explain.
        missing = tmp_path / "missing.yaml"
        missing.write_text("name: nf\nworkers: 1\ngpus_per_worker: 1\nmax_retry: 0\n"
                           "command: [no-such-trainer-x1, --fast]\n")
        out = run_cli("submit", str(missing), env=env, timeout=30)
        assert out.returncode == 0, out.stderr
        nf = out.stdout.strip()

        def explained() -> str | None:
            shown = run_cli("explain", nf, env=env, timeout=30)
            said = "command not found: no-such-trainer-x1" in shown.stdout
            return shown.stdout if said and "failed" in shown.stdout else None
        text = str(wait_until(explained, "explain to show the missing command", 60))
        assert "exit 127" in text and "exited with code 127" in text, text
        log = state.resolve() / "jobs" / nf / "attempt-1" / "rank-0.log"
        assert f"worker logs: {log}" in text and "command not found" in log.read_text()

        for name in ("scheduler", f"agent-{other}"):
            old = stack(state).children[name].pid
            kill_group(old)
            wait_until(lambda n=name, o=old: restarted(state, n, o), f"{name} restarted", 30)
            assert f'"child": "{name}"' in first.text() or f"restarted[/] {name}" in first.text()
        assert "child restarted" in first.text() and "restarted scheduler (restart 1)" \
            in first.text(), first.text()[-3000:]

        # nats-server: again on the same URL and store; the CLI reads the job there.
        old_nats = stack(state).children["nats-server"].pid
        kill_group(old_nats)
        after = wait_until(lambda: restarted(state, "nats-server", old_nats),
                           "nats-server restarted", 30)
        assert after.nats_url == info.nats_url  # type: ignore[union-attr]

        def job_running() -> bool:
            listing = run_cli("jobs", "--json", env=env, timeout=30)
            return listing.returncode == 0 and '"running"' in listing.stdout
        wait_until(job_running, "the job listed as running after the nats restart", 60)
        assert alive(worker), "the worker died with a service, an agent or nats"
        assert first.proc.poll() is None

        # `up` itself is SIGKILLed: its children live on, the next `up` kills them.
        left = stack(state)
        kill_group(first.proc.pid)  # only `up`: each child has a session of its own
        first.proc.wait(10)
        assert alive(left.children["scheduler"].pid) and alive(worker)
        listener = BeatListener(state, owner=-1)
        second = Up(env)
        listener.owner = second.proc.pid
        listener.start()
        second.wait_for("cleaned up", 60)
        for child in left.children.values():
            assert not alive(child.pid), f"{child} outlived the cleanup"
        assert not alive(worker)
        t_ready = second.wait_for("2 nodes ready", 180)
        assert listener.connected.is_set()
        now = stack(state)
        agents = {n: now.children[f"agent-{n}"].pid for n in now.nodes}
        beats = [listener.first.get((n, pid)) for n, pid in agents.items()]
        assert all(b is not None for b in beats), (agents, listener.first)
        # Ready is said after each new agent's first beat (one interval of slack
        # for the listener, which may hear a beat after `up` did).
        assert t_ready >= max(b for b in beats if b is not None) - 1.0
        listener.done.set()

        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(60) == 0, second.text()[-3000:]
        assert not (state / STACK_FILE).exists()
        for child in now.children.values():
            assert not alive(child.pid), child
    finally:
        for up in (first, second):
            if up is not None and up.proc.poll() is None:
                up.proc.send_signal(signal.SIGTERM)
                try:
                    up.proc.wait(60)
                except subprocess.TimeoutExpired:
                    kill_group(up.proc.pid)
        leftover = read_stack_file(state / STACK_FILE) if (state / STACK_FILE).exists() else None
        for child in (leftover.children.values() if leftover else []):
            if alive(child.pid):
                kill_group(child.pid)


def test_up_stopped_while_starting_leaves_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    env.update(PRIMUS_STATE_DIR=str(state), OMP_NUM_THREADS="1")
    up = Up(env)
    try:
        info = wait_until(lambda: (state / STACK_FILE).exists() and len(
            stack(state).children) > 2 and stack(state), "up to start its children", 30)
        up.proc.send_signal(signal.SIGTERM)  # before any node is ready
        assert up.proc.wait(60) == 0, up.text()[-3000:]
        assert "nodes ready" not in up.text() and "Traceback" not in up.text()
        assert not (state / STACK_FILE).exists()
        for child in info.children.values():  # type: ignore[union-attr]
            assert not alive(child.pid), child
    finally:
        if up.proc.poll() is None:
            kill_group(up.proc.pid)
