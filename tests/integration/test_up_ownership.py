"""What `primus-safe up` decides and writes, without starting a stack: the
restart backoff (pure), stack.json (atomic, corrupt named), who owns a state
dir (a live owner refuses, a dead one's children are killed), and how CLI
verbs fail without a bus and resolve a job file's paths. Real processes, real
CLI subprocesses; no nats-server is needed for what is tested here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.client import resolve_paths
from libs.drivers.local import LocalDriver, cannot_run
from libs.embedded import (
    STACK_FILE,
    ChildRecord,
    NatsServer,
    RestartPolicy,
    Restarts,
    StackBusy,
    StackFileError,
    StackInfo,
    claim_state_dir,
    lock_state_dir,
    on_exit,
    on_restart,
    process_start,
    read_stack_file,
    write_stack_file,
)
from libs.events import Event, JobSpec, WorkerExited, WorkerSlot
from libs.specs import load_model
from tests.helpers import ROOT, run_cli

# --------------------------------------------------------------------------- restart policy


def test_backoff_doubles_for_crashes_in_a_row_and_is_capped() -> None:
    policy = RestartPolicy(base_s=0.5, factor=2, max_s=3, healthy_after_s=60)
    state, now, delays = Restarts(started_at=0.0), 0.0, []
    for _ in range(5):
        now += 1  # each run lasts 1 s: a crash loop
        state = on_exit(state, now=now, policy=policy)
        assert state.due_at is not None
        delays.append(state.due_at - now)
        now = state.due_at
        state = on_restart(state, now=now)
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert state.restarts == 5 and state.streak == 5 and not state.gave_up


def test_a_healthy_run_resets_the_backoff_but_not_the_count() -> None:
    policy = RestartPolicy(base_s=1, factor=2, max_s=30, healthy_after_s=10)
    state = on_restart(on_exit(Restarts(started_at=0), now=1, policy=policy), now=2)
    state = on_restart(on_exit(state, now=3, policy=policy), now=5)
    assert state.streak == 2
    state = on_exit(state, now=5 + 10, policy=policy)  # ran 10 s: healthy
    assert state.streak == 1 and state.due_at == 15 + 1
    assert on_restart(state, now=16).restarts == 3


def test_give_up_after_n_crashes_in_a_row() -> None:
    policy = RestartPolicy(base_s=0.1, healthy_after_s=60, give_up_after=2)
    state = Restarts(started_at=0)
    for now in (1.0, 2.0):
        state = on_restart(on_exit(state, now=now, policy=policy), now=now + 0.5)
    state = on_exit(state, now=3, policy=policy)
    assert state.gave_up and state.due_at is None and state.restarts == 2


def test_the_default_policy_never_gives_up() -> None:
    state, policy = Restarts(), RestartPolicy()
    for now in range(1, 200):
        state = on_restart(on_exit(state, now=float(now), policy=policy), now=float(now))
    assert not state.gave_up and state.restarts == 199


# --------------------------------------------------------------------------- stack.json


def _sleeper() -> subprocess.Popen[bytes]:
    """A real process in its own session, like every child of the stack."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)


def _info(pid: int, **children: subprocess.Popen[bytes]) -> StackInfo:
    return StackInfo(nats_url="nats://127.0.0.1:1", pid=pid, pid_start=process_start(pid),
                     started_at="2026-01-01T00:00:00+00:00",
                     children={n: ChildRecord(pid=p.pid, start=process_start(p.pid))
                               for n, p in children.items()})


def test_stack_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    info = _info(os.getpid())
    write_stack_file(tmp_path / STACK_FILE, info)
    assert read_stack_file(tmp_path / STACK_FILE) == info
    assert [p.name for p in tmp_path.iterdir()] == [STACK_FILE]  # no temp file left
    assert read_stack_file(tmp_path / "absent.json") is None


@pytest.mark.parametrize("text", ["{bad", "[]", '{"nats_url": "x"}', ""])
def test_a_corrupt_stack_file_is_named_with_the_fix(tmp_path: Path, text: str) -> None:
    path = tmp_path / STACK_FILE
    path.write_text(text)
    with pytest.raises(StackFileError) as err:
        read_stack_file(path)
    assert str(path) in str(err.value) and "corrupt" in str(err.value)
    assert f"rm {path}" in str(err.value)
    with pytest.raises(StackFileError):
        claim_state_dir(tmp_path)  # up refuses too: it cannot tell who owns the dir


def test_cli_verbs_name_a_corrupt_stack_file_in_one_line(tmp_path: Path,
                                                         cli_env: dict[str, str]) -> None:
    state = Path(cli_env["PRIMUS_STATE_DIR"])
    state.mkdir()
    (state / STACK_FILE).write_text('{"nats_url": ')
    for verb in (["jobs"], ["nodes"], ["up", "--nodes", "1"]):
        out = run_cli(*verb, env=cli_env, timeout=20)
        assert out.returncode == 1, (verb, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "is corrupt" in lines[0] and str(state / STACK_FILE) in lines[0]
        assert "Traceback" not in out.stderr and out.stdout == ""


def test_a_live_owner_refuses_a_second_up(tmp_path: Path) -> None:
    owner = _sleeper()
    try:
        write_stack_file(tmp_path / STACK_FILE, _info(owner.pid))
        with pytest.raises(StackBusy) as err:
            claim_state_dir(tmp_path)
        assert f"pid {owner.pid}" in str(err.value) and "2026-01-01T00:00:00" in str(err.value)
        assert f"kill {owner.pid}" in str(err.value)
        assert (tmp_path / STACK_FILE).exists() and owner.poll() is None
    finally:
        owner.kill()
        owner.wait()


def test_a_dead_owners_children_and_workers_are_killed(tmp_path: Path) -> None:
    owner = _sleeper()
    children = {"nats-server": _sleeper(), "scheduler": _sleeper()}
    worker = _sleeper()  # a training worker the dead stack's driver left
    (tmp_path / "pids" / "n1").mkdir(parents=True)
    (tmp_path / "pids" / "n1" / str(worker.pid)).write_text("j 1 0\n")
    info = _info(owner.pid, **children)
    owner.kill()
    owner.wait()
    write_stack_file(tmp_path / STACK_FILE, info)
    try:
        killed = claim_state_dir(tmp_path)
        assert sorted(killed) == sorted([*(c.pid for c in children.values()), worker.pid])
        for proc in (*children.values(), worker):
            assert proc.wait(5) == -signal.SIGKILL
        assert not (tmp_path / STACK_FILE).exists()
    finally:
        for proc in (*children.values(), worker):
            proc.kill()
            proc.wait()


def test_two_ups_starting_together_cannot_both_own_the_dir(tmp_path: Path) -> None:
    """The lock, not only stack.json: the other `up` may not have written it yet."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from libs.embedded import lock_state_dir; h = lock_state_dir(Path(sys.argv[1])); "
         "print('locked', flush=True); time.sleep(60)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(StackBusy, match="a stack is starting in"):
            lock_state_dir(tmp_path)
        write_stack_file(tmp_path / STACK_FILE, _info(holder.pid))
        with pytest.raises(StackBusy, match=f"pid {holder.pid}"):
            lock_state_dir(tmp_path)
        holder.kill()  # however it dies, the kernel drops its lock
        holder.wait()
        lock_state_dir(tmp_path).close()
    finally:
        holder.kill()
        holder.wait()


def test_demo_does_not_wipe_a_live_stacks_dir(tmp_path: Path, cli_env: dict[str, str]) -> None:
    owner = _sleeper()
    try:
        write_stack_file(tmp_path / STACK_FILE, _info(owner.pid))
        (tmp_path / "keep").write_text("x")
        out = run_cli("demo", "--state-dir", str(tmp_path), env=cli_env, timeout=30)
        assert out.returncode == 1 and f"pid {owner.pid}" in out.stderr
        assert (tmp_path / "keep").exists() and owner.poll() is None
    finally:
        owner.kill()
        owner.wait()


def test_a_reused_pid_is_not_killed(tmp_path: Path) -> None:
    """The recorded start time must match: a pid the kernel gave to another
    process since the stack died is left alone."""
    bystander = _sleeper()
    try:
        start = process_start(bystander.pid)
        assert start is not None
        info = StackInfo(nats_url="nats://127.0.0.1:1", pid=2 ** 22 + 1,
                         children={"scheduler": ChildRecord(pid=bystander.pid, start=start - 1)})
        write_stack_file(tmp_path / STACK_FILE, info)
        assert claim_state_dir(tmp_path) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# --------------------------------------------------------------------------- submit without a bus


def test_submit_without_a_bus_fails_fast_on_stderr_only(tmp_path: Path,
                                                        cli_env: dict[str, str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nworkers: 1\ncommand: [python, -c, 'pass']\n")
    # What starting the CLI costs on this machine now (a loaded machine
    # starts Python slower): the bus's part must stay within its 2 s.
    t0 = time.monotonic()
    assert run_cli("--help", env=cli_env, timeout=20).returncode == 0
    start = time.monotonic() - t0
    t0 = time.monotonic()
    out = run_cli("submit", str(job), env=cli_env, timeout=20)
    took = time.monotonic() - t0
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    stack = Path(cli_env["PRIMUS_STATE_DIR"]).resolve() / STACK_FILE
    assert str(stack) in lines[0] and "PRIMUS_NATS_URL (unset)" in lines[0]
    assert "Connection refused" in lines[0] and "Traceback" not in out.stderr
    assert took < start + 2.5, f"took {took:.1f} s (starting the CLI alone: {start:.1f} s)"


def test_submit_names_primus_nats_url_when_set(tmp_path: Path, cli_env: dict[str, str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nworkers: 1\ncommand: [python, -c, 'pass']\n")
    env = {**cli_env, "PRIMUS_NATS_URL": "nats://127.0.0.1:9"}
    out = run_cli("submit", str(job), env=env, timeout=20)
    assert out.returncode == 1 and out.stdout == ""
    assert "looked at PRIMUS_NATS_URL" in out.stderr and "nats://127.0.0.1:9" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_submit_names_a_stack_whose_up_is_dead(tmp_path: Path, cli_env: dict[str, str]) -> None:
    state = Path(cli_env["PRIMUS_STATE_DIR"])
    state.mkdir()
    write_stack_file(state / STACK_FILE, StackInfo(nats_url="nats://127.0.0.1:9",
                                                   pid=2 ** 22 + 1))
    out = run_cli("jobs", env=cli_env, timeout=20)
    assert out.returncode == 1 and out.stdout == ""
    assert "is no longer running" in out.stderr and str(2 ** 22 + 1) in out.stderr


def test_a_wrong_token_is_named_as_the_reason(tmp_path: Path, cli_env: dict[str, str]) -> None:
    server = NatsServer(tmp_path / "nats", token="right").start()
    try:
        state = Path(cli_env["PRIMUS_STATE_DIR"])
        state.mkdir()
        write_stack_file(state / STACK_FILE, StackInfo(nats_url=server.url, nats_token="wrong",
                                                       pid=os.getpid()))
        t0 = time.monotonic()
        out = run_cli("jobs", env=cli_env, timeout=20)
        assert out.returncode == 1 and out.stdout == "" and time.monotonic() - t0 < 3.5
        assert "Authorization Violation" in out.stderr and str(state / STACK_FILE) in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    finally:
        server.stop()


# --------------------------------------------------------------------------- job file paths


def test_relative_workdir_and_command_resolve_against_the_job_file(tmp_path: Path) -> None:
    jobs = tmp_path / "project" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "default.yaml").write_text("name: a\nworkers: 1\ncommand: [./run.sh]\n")
    (jobs / "sub.yaml").write_text("name: b\nworkers: 1\nworkdir: ../code\ncommand: [./run.sh]\n")
    (jobs / "abs.yaml").write_text(f"name: c\nworkers: 1\nworkdir: {tmp_path}\ncommand: [x]\n")
    here = Path.cwd()
    os.chdir(tmp_path)  # the submitter stands elsewhere
    try:
        def resolved(name: str) -> str | None:
            rel = Path("project/jobs") / name
            return resolve_paths(load_model(rel, JobSpec), rel).workdir
        assert resolved("default.yaml") == str(jobs)
        assert resolved("sub.yaml") == str(tmp_path / "project" / "code")
        assert resolved("abs.yaml") == str(tmp_path)
    finally:
        os.chdir(here)


def test_cannot_run_says_what_a_shell_would(tmp_path: Path) -> None:
    path = os.environ.get("PATH", os.defpath)
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "run.sh").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "run.sh").chmod(0o755)
    assert cannot_run(["no-such-tool-x1"], str(tmp_path), path) == (
        127, "command not found: no-such-tool-x1 (not on PATH)")
    assert cannot_run(["./missing.sh"], str(tmp_path), path)[0] == 127  # type: ignore[index]
    assert cannot_run(["./plain.txt"], str(tmp_path), path)[0] == 126  # type: ignore[index]
    assert cannot_run(["./run.sh"], str(tmp_path), path) is None
    assert cannot_run(["sh", "-c", "true"], str(tmp_path), path) is None
    assert cannot_run(["sh"], str(tmp_path / "gone"), path)[0] == 127  # type: ignore[index]


async def test_a_missing_executable_exits_127_with_its_reason_in_the_log(tmp_path: Path) -> None:
    events: list[Event] = []

    async def sink(event: Event) -> None:
        events.append(event)

    driver = LocalDriver(tmp_path, sink, nats_url="nats://127.0.0.1:1")
    spec = JobSpec(name="nf", workers=2, command=["no-such-trainer-x1", "--fast"],
                   workdir=str(tmp_path))
    slots = [WorkerSlot(rank=0, node="a", gpus=0), WorkerSlot(rank=1, node="b", gpus=0)]
    await driver.launch("nf", 1, spec, slots)
    exits = [e for e in events if isinstance(e, WorkerExited)]
    assert [(e.data.rank, e.data.exit_code) for e in exits] == [(0, 127), (1, 127)]
    assert exits[0].data.reason == "command not found: no-such-trainer-x1 (not on PATH)"
    log = tmp_path / "jobs" / "nf" / "attempt-1" / "rank-0.log"
    assert "command not found: no-such-trainer-x1" in log.read_text()
    await driver.launch("nf", 1, spec, slots)  # a relaunch knows these ranks ran
    assert len([e for e in events if isinstance(e, WorkerExited)]) == 2
