"""The thin path end to end on the embedded stack: real nats-server, chDB,
five services as processes, local nodes with real DDP workers."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from libs.bus import Bus
from libs.embedded import EmbeddedStack
from libs.events import parse_event
from libs.records import BUCKETS
from tests.helpers import ROOT, run_cli, stack_cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


async def poll(fn, what: str, timeout: float = 120, every: float = 0.3):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = await fn()
        if result:
            return result
        await asyncio.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


async def bucket(bus: Bus, name: str) -> dict[str, dict]:  # type: ignore[type-arg]
    """A state bucket's records as stored (JSON), {} while it cannot be read."""
    try:
        records = await bus.records(next(b for b in BUCKETS if b.name == name))
        return {k: json.loads(r.model_dump_json()) for k, r in (await records.load()).items()}
    except Exception:
        return {}


async def lens(bus: Bus, query: str, **params: object) -> list[dict]:  # type: ignore[type-arg]
    reply = await bus.request("safe.query.lens.query", {"query": query, "params": params},
                              timeout_s=20)
    assert reply["ok"], reply
    return [dict(zip(reply["columns"], r, strict=True)) for r in reply["rows"]]


async def control_ids(bus: Bus, upto: int) -> list[str]:
    ids = []
    for seq in range(1, upto + 1):
        msg = await bus.js.get_msg("CONTROL", seq)
        ids.append(parse_event(msg.data).id)
    return ids


def test_thin_path(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack", nodes=3).start()
    try:
        asyncio.run(_thin_path(stack, tmp_path))
    finally:
        codes = stack.stop()
    assert codes == dict.fromkeys(codes, 0), f"unclean exits: {codes}; {stack.stragglers}"


async def _thin_path(stack: EmbeddedStack, tmp_path: Path) -> None:
    assert stack.nats is not None
    bus = await Bus.connect(stack.nats.url, "e2e", token=stack.nats.token)
    env = stack_cli_env(stack.state_dir)
    try:
        async def all_ready() -> bool:
            nodes = await bucket(bus, "nodes")
            return len(nodes) == 3 and all(n["state"] == "ready" for n in nodes.values())

        await poll(all_ready, "nodes to be ready")
        job_file = tmp_path / "job.yaml"
        job_file.write_text("name: e2e\nworkers: 2\ngpus_per_worker: 1\ncheckpoint_interval: 20\n"
                            "command: [python, examples/train_tiny.py, --iterations, '40']\n"
                            # relative paths mean the job file's dir: this one is elsewhere
                            f"workdir: {ROOT}\n")
        submitted = await asyncio.to_thread(run_cli, "submit", str(job_file), env=env)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()

        async def done() -> dict | None:  # type: ignore[type-arg]
            record = (await bucket(bus, "jobs")).get(job)
            return record if record and record["status"] in ("completed", "failed") else None

        record = await poll(done, "the job to finish", timeout=180)
        assert record["status"] == "completed" and record["attempt"] == 1
        assert len({s["node"] for s in record["slots"]}) == 2  # a gang across two nodes

        async def telemetry() -> list[dict] | None:  # type: ignore[type-arg]
            rows = await lens(bus, "job_summary", job=job)
            return rows if rows and rows[0]["samples"] >= 80 else None

        summary = (await poll(telemetry, "job telemetry in ClickHouse", 30))[0]
        assert summary["ranks"] == 2 and summary["last_iteration"] == 40
        assert summary["last_loss"] < summary["first_loss"]
        assert summary["checkpoints"] == 4  # steps 20 and 40, two ranks each

        async def node_rows() -> bool:
            rows = await lens(bus, "node_summary", node="node-1")
            return bool(rows and rows[0]["samples"] > 0)

        await poll(node_rows, "node telemetry in ClickHouse", 30)

        # Every control event in the stream is in the history table exactly once.
        last = (await bus.js.stream_info("CONTROL")).state.last_seq
        published = await control_ids(bus, last)
        assert len(published) == len(set(published))

        async def history_complete() -> dict[str, int] | None:
            stored = {r["id"]: r["copies"] for r in await lens(bus, "event_ids")}
            return stored if set(published) <= set(stored) else None

        stored = await poll(history_complete, "every event in the history table", 30)
        assert all(copies == 1 for copies in stored.values())
        later = await control_ids(bus, (await bus.js.stream_info("CONTROL")).state.last_seq)
        assert set(stored) <= set(later)  # nothing stored that was not published
        types = {parse_event((await bus.js.get_msg("CONTROL", s)).data).type
                 for s in range(1, last + 1)}
        assert {"node.registered", "bench.request", "bench.result", "node.state",
                "job.submitted", "job.placed", "worker.started", "worker.exited",
                "job.completed"} <= types
        assert "node.heartbeat" not in types  # liveness is never history (core NATS)
    finally:
        await bus.close()

    ran = await asyncio.to_thread(run_cli, "bench", "run", "--node", "node-3", "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["data"]["passed"] is True
    fleet = json.loads((await asyncio.to_thread(run_cli, "bench", "report", "--json",
                                                env=env)).stdout)
    assert sorted(r["node"] for r in fleet) == ["node-1", "node-2", "node-3"]
    assert all(r["name"] == "gemm_fp32_512_tflops" and r["peers"] == 3 for r in fleet)

    jobs = json.loads((await asyncio.to_thread(run_cli, "jobs", "--json", env=env)).stdout)
    assert [(j["job"], j["status"]) for j in jobs] == [(job, "completed")]
    nodes = json.loads((await asyncio.to_thread(run_cli, "nodes", "--json", env=env)).stdout)
    assert {n["node"]: n["state"] for n in nodes} == dict.fromkeys(stack.node_names, "ready")
    shown = await asyncio.to_thread(run_cli, "lens", "job", job, "--json", env=env)
    assert json.loads(shown.stdout)["summary"]["last_iteration"] == 40
    text = await asyncio.to_thread(run_cli, "lens", "job", job, env=env)
    assert "iterations up to 40" in text.stdout
    explained = (await asyncio.to_thread(run_cli, "explain", job, env=env)).stdout
    assert f"job {job} (e2e): completed" in explained
    assert "job.placed" in explained and "attempt 1 on node-" in explained


UNMODIFIED = ROOT / "examples" / "unmodified"


def imported_modules(script: Path) -> set[str]:
    """The top-level names of every module ``script`` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_demo_recovers_from_a_killed_node(tmp_path: Path) -> None:
    """`primus-safe demo`: an SDK job and an unmodified Megatron-style job train
    at once; rank 0's node of the unmodified one dies mid-interval. Lens has
    that job's loss curve from its log lines alone, failover opens a fault
    naming where it resumes, the job's own --load continues from its newest
    checkpoint on healthy nodes and the curve goes on; the SDK job is untouched."""
    # Nothing but the standard library and torch: whatever Lens knows of this
    # job's training, it read from the lines the script printed.
    script = UNMODIFIED / "train_megatron_style.py"
    assert imported_modules(script) <= set(sys.stdlib_module_names) | {"torch"}
    command = yaml.safe_load((UNMODIFIED / "job.yaml").read_text())["command"]
    iterations = int(command[command.index("--train-iters") + 1])
    sdk_command = yaml.safe_load((ROOT / "examples" / "job.yaml").read_text())["command"]
    sdk_iterations = int(sdk_command[sdk_command.index("--iterations") + 1])

    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIMUS_")}
    result = run_cli("demo", "--json", "--state-dir", str(tmp_path / "demo"), env=env,
                     timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    job, sdk, killed = summary["unmodified"], summary["sdk"], summary["killed_node"]

    assert job["job_status"] == "completed" and job["attempts"] == 2
    assert killed in job["first_nodes"] and killed not in job["final_nodes"]
    assert summary["node_states"][killed] == "quarantined"
    # Failover's fault names the job, the checkpoint it resumes from (the
    # newest complete one in Megatron's layout when the node died) and the
    # training time lost since that checkpoint.
    fault = summary["fault"]
    assert fault["jobs"] == [job["job"]]
    resume = job["resume_step"]
    assert resume == fault["resume_step"][job["job"]] == job["checkpoint_iteration"] > 0
    assert fault["lost_work_s"][job["job"]] == job["lost_work_s"] >= 0
    # Its own --load continued after that checkpoint, not from scratch, and ran to the end.
    assert job["resumed_at_iteration"] == resume + 1 > 1
    assert f"at iteration {resume}" in job["resume_line"]
    first, last = job["attempt_iterations"]
    assert first[:2] == [1, 1] and first[2] >= job["killed_at_iteration"] > resume
    assert last == [2, resume + 1, iterations]

    # The loss curve in Lens, parsed from the log lines: every iteration once,
    # falling, and past the resume it goes on from where the checkpoint was.
    curve = {int(i): loss for i, loss in job["loss_curve"]}
    assert sorted(curve) == list(range(1, iterations + 1))
    assert job["telemetry_samples"] >= iterations
    assert job["loss_first"] == curve[1] and job["loss_last"] == curve[iterations]
    assert curve[resume + 1] < 0.6 * curve[1]  # a model from random would be back near the start
    assert curve[iterations] < curve[resume + 1]
    # The iterations redone after the resume (printed by both attempts, as
    # `primus-safe logs` shows them) computed the same losses as the first
    # time: model, optimizer and RNG state came back exactly.
    redone = job["redone_losses"]
    assert [i for i, _, _ in redone] == list(range(resume + 1, first[2] + 1))
    assert all(before == after == pytest.approx(curve[i]) for i, before, after in redone)
    assert job["log_lines"] >= iterations + len(redone)
    assert set(job["log_lines_per_attempt"]) == {"1", "2"}

    recovery = summary["recovery_s"]  # failover timed every phase, in order
    assert summary["detection_s"] < 10
    assert 0 < recovery["detection_s"] <= recovery["mitigation_s"] <= recovery["replacement_s"] \
        <= recovery["first_step_s"]  # the first step: job.progress, read from the job's output

    # The SDK job ran elsewhere and was not disturbed; its telemetry is the SDK's
    # (every rank reports every iteration).
    assert sdk["job_status"] == "completed" and sdk["attempts"] == 1
    assert killed not in sdk["first_nodes"] and sdk["first_nodes"] == sdk["final_nodes"]
    assert sdk["last_iteration"] == sdk_iterations and sdk["loss_last"] < sdk["loss_first"]
    assert sdk["telemetry_samples"] >= 2 * sdk_iterations
    assert summary["clean_shutdown"] is True, \
        f"unclean exits: {summary['exit_codes']}; {summary.get('stragglers')}"
