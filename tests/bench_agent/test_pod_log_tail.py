"""The agent's tail of its worker pods' logs on a real ``/var/log/pods``-shaped
tree that the test writes as the kubelet and containerd do: CRI records,
lines split into P records, ``0.log`` renamed ``0.log.<time>`` on rotation
with a new ``0.log`` after it, ``1.log`` for a restarted container. The
agent is restarted in the middle of sending a round; every line reaches
the batches once, in order, numbered without a gap, and the round sent
again is the same batches (same ids, same lines), which JetStream and the
``logs`` table store once."""

from __future__ import annotations

import gzip
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from libs.drivers.k8s_manifests import CONTAINER, pod_name
from libs.events import WorkerLog
from libs.log_shipper import CUT_MARK, LogLimits
from services.bench.pod_logs import PodLogs, Round, WorkerId

NS = "primus"
NODE = "gpu-07"


def stamp(t: float) -> bytes:
    """RFC 3339 with nanoseconds, as containerd writes it."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").encode() + b"123Z"


@dataclass
class Worker:
    """One worker pod's log directory, written as the runtime writes it."""

    dir: Path
    restart: int = 0
    t: float = 1_700_000_000.0
    printed: list[tuple[str, str]] = field(default_factory=list)  # (stream, line) in order

    def _append(self, data: bytes) -> None:
        with open(self.dir / f"{self.restart}.log", "ab") as f:
            f.write(data)

    def print(self, text: str, stream: str = "stdout", *, pieces: int = 1) -> None:
        """A line, split into ``pieces`` records (P ... P F) like a runtime
        splits a long line."""
        raw = text.encode()
        step = -(-len(raw) // pieces) or 1
        parts = [raw[i:i + step] for i in range(0, len(raw), step)] or [b""]
        for i, part in enumerate(parts):
            self.t += 0.001
            tag = b"F" if i == len(parts) - 1 else b"P"
            self._append(b"%s %s %s %s\n" % (stamp(self.t), stream.encode(), tag, part))
        self.printed.append((stream, text))

    def print_unfinished(self, text: str) -> None:
        self.t += 0.001
        self._append(b"%s stdout P %s\n" % (stamp(self.t), text.encode()))

    def finish(self, text: str, whole: str) -> None:
        self.t += 0.001
        self._append(b"%s stdout F %s\n" % (stamp(self.t), text.encode()))
        self.printed.append(("stdout", whole))

    def rotate(self, when: str) -> Path:
        """The kubelet renames the live file; the runtime's next write makes a new one."""
        rotated = self.dir / f"{self.restart}.log.{when}"
        os.rename(self.dir / f"{self.restart}.log", rotated)
        return rotated

    def restart_container(self) -> None:
        self.restart += 1


def make_worker(root: Path, job: str, rank: int) -> tuple[str, Worker]:
    name = f"{NS}_{pod_name(job, 1, rank)}_{uuid.uuid4()}"
    (root / name / CONTAINER).mkdir(parents=True)
    return name, Worker(root / name / CONTAINER)


def agent(root: Path, positions: Path, limits: LogLimits | None = None) -> PodLogs:
    pods = PodLogs(root, positions, namespace=NS, node=NODE, limits=limits or LogLimits(),
                   source=f"bench-agent/{NODE}")
    pods.load()
    return pods


def shipped(rounds: list[list[WorkerLog]]) -> dict[int, list[tuple[int, str, str]]]:
    """Each rank's lines as stored: a batch id seen twice must carry the same
    lines (it is stored once); (seq, stream, text) in seq order."""
    by_id: dict[str, WorkerLog] = {}
    for batch in (b for r in rounds for b in r):
        if batch.id in by_id:
            assert by_id[batch.id].data == batch.data, f"{batch.id} sent twice, different"
        by_id[batch.id] = batch
    lines: dict[int, list[tuple[int, str, str]]] = {}
    for b in by_id.values():
        assert (b.job, b.node, b.source, b.data.attempt) == ("train-7", NODE,
                                                             f"bench-agent/{NODE}", 1)
        lines.setdefault(b.data.rank, []).extend(
            (b.data.seq + i, s, t) for i, (s, t) in enumerate(zip(b.data.stream, b.data.text,
                                                                   strict=True)))
    return {rank: sorted(rows) for rank, rows in lines.items()}


def assert_complete(rows: list[tuple[int, str, str]], worker: Worker) -> None:
    assert [r[0] for r in rows] == list(range(len(rows))), "line numbers with a gap or twice"
    assert [(s, t) for _, s, t in rows] == worker.printed


def test_two_pods_through_partial_lines_rotation_restart_and_an_agent_restart(
        tmp_path: Path) -> None:
    root, positions = tmp_path / "pods", tmp_path / "state" / "positions.json"
    n0, w0 = make_worker(root, "train-7", 0)
    n1, w1 = make_worker(root, "train-7", 1)
    (root / "kube-system_coredns-7db6d8ff4d-x2x4v_9f2b").mkdir()  # not ours: never read
    pods = agent(root, positions)
    assert sorted(pods.scan(time.time())) == sorted([(n0, pod_name("train-7", 1, 0)),
                                                     (n1, pod_name("train-7", 1, 1))])
    pods.adopt(n0, WorkerId("train-7", 1, 0), workers=2)
    pods.adopt(n1, WorkerId("train-7", 1, 1), workers=2)
    rounds: list[list[WorkerLog]] = []

    def round_(p: PodLogs, *, ack: bool = True) -> Round:
        p.scan(time.time())
        done = p.poll()
        rounds.append(done.batches)
        if ack:
            p.commit(done)
        return done

    # Round 1: plain lines, both streams, a line the runtime split in three.
    for i in range(5):
        w0.print(f"rank 0 line {i}")
    w0.print("Traceback: on stderr", "stderr")
    w0.print("one long line the runtime split into pieces", pieces=3)
    w1.print("rank 1 starts")
    w1.print_unfinished("half of a line ")  # its F comes in a later round
    round_(pods)

    # Round 2: the rest of the open line; rank 0 printed more, then the
    # kubelet rotated its file and it printed on into the new 0.log.
    w1.finish("and its end", "half of a line and its end")
    w0.print("written just before the rotation")
    rotated = w0.rotate("20231114-221320")
    w0.print("first line of the new 0.log")
    round_(pods)
    assert (w0.dir / "0.log").stat().st_ino != rotated.stat().st_ino

    # Round 3: rank 0's container dies mid-line and restarts (1.log).
    w0.print_unfinished("last words without a newline")
    w0.printed.append(("stdout", "last words without a newline"))
    w0.restart_container()
    w0.print("restarted container, first line")
    round_(pods)

    # Round 4 is read and about to be sent when the agent dies.
    w0.print("in the round that was never acknowledged")
    w1.print("rank 1 in that round too", pieces=2)
    lost = round_(pods, ack=False)
    assert lost.batches
    for reader in pods.pods.values():
        reader.close()

    # While the agent is away: more output, and rank 1's file rotates.
    w1.print("printed while the agent was away")
    w1.rotate("20231114-221330")
    w1.print("after that rotation")

    # The new agent re-reads exactly the unacknowledged round first...
    again = agent(root, positions)
    assert set(again.pods) == {n0, n1}  # from the positions file, no lookup
    assert again.scan(time.time()) == []
    replayed = round_(again)
    assert [(b.id, b.data) for b in replayed.batches] == [(b.id, b.data) for b in lost.batches]
    # ...then what came while it was away, never anything from the start.
    round_(again)
    round_(again)  # nothing new: nothing sent
    assert rounds[-1] == []

    lines = shipped(rounds)
    assert_complete(lines[0], w0)
    assert_complete(lines[1], w1)
    assert again.snapshot()["malformed_records"] == 0
    assert again.snapshot()["lost_files"] == 0


def test_a_removed_pod_is_read_to_its_end_and_forgotten(tmp_path: Path) -> None:
    root, positions = tmp_path / "pods", tmp_path / "positions.json"
    name, w = make_worker(root, "train-7", 0)
    pods = agent(root, positions)
    pods.scan(time.time())
    pods.adopt(name, WorkerId("train-7", 1, 0), workers=1)
    w.print("hello")
    rounds = [pods.poll().batches]
    w.print("printed just before the pod was deleted")
    w.print_unfinished("and an unfinished line")
    w.printed.append(("stdout", "and an unfinished line"))
    shutil.rmtree(root / name)  # the open file is still read
    pods.scan(time.time())
    done = pods.poll()
    pods.commit(done)
    rounds.append(done.batches)
    assert pods.pods == {} and pods.finished == 1
    assert_complete(shipped(rounds)[0], w)
    assert '"pods":{}' in positions.read_text()


def test_a_file_compressed_while_the_agent_was_away_is_counted_lost(tmp_path: Path) -> None:
    root, positions = tmp_path / "pods", tmp_path / "positions.json"
    name, w = make_worker(root, "train-7", 0)
    pods = agent(root, positions)
    pods.scan(time.time())
    pods.adopt(name, WorkerId("train-7", 1, 0), workers=1)
    w.print("read before the agent stopped")
    pods.commit(pods.poll())
    pods.pods[name].close()
    w.print("never read: rotated and compressed while the agent was away")
    first = w.rotate("20231114-221320")
    w.print("in the second file")
    second = w.rotate("20231114-221330")
    with open(first, "rb") as src, gzip.open(f"{first}.gz", "wb") as dst:
        dst.write(src.read())
    first.unlink()
    w.print("in the live file")
    again = agent(root, positions)
    batches = again.poll().batches
    assert again.snapshot()["lost_files"] == 1
    # From the live file on (the uncompressed second file has an inode the
    # position cannot name: without it the reader would need every file's
    # history); nothing twice, numbering goes on from the last line stored.
    texts = [(b.data.seq, t) for b in batches for t in b.data.text]
    assert texts == [(1, "in the live file")]
    assert second.exists()


def test_a_worker_far_over_its_rate_is_cut_down_with_the_drop_told(tmp_path: Path) -> None:
    """100 MB/s of output at a 64 KiB/s worker rate: most chunks are dropped
    unparsed and counted, the batches say how much, a round stays short."""
    root, positions = tmp_path / "pods", tmp_path / "positions.json"
    name, w = make_worker(root, "train-7", 0)
    limits = LogLimits(rate_bytes_s=64 << 10, min_rate_bytes_s=64 << 10, burst_s=1.0,
                       max_line_bytes=1024)
    pods = agent(root, positions, limits)
    pods.scan(time.time())
    pods.adopt(name, WorkerId("train-7", 1, 0), workers=1)
    w.print("x" * 5000)  # one record longer than max_line_bytes: cut, with the marker
    line = b" stdout F " + b"y" * 90 + b"\n"
    with open(w.dir / "0.log", "ab") as f:  # 200,000 lines over 0.2 s of worker time
        for block in range(200):
            t = w.t + block * 0.001
            f.write(b"".join(stamp(t + i * 1e-6) + line for i in range(1000)))
    started = time.monotonic()
    done = pods.poll()
    took = time.monotonic() - started
    texts = [t for b in done.batches for t in b.data.text]
    assert texts[0].startswith("x" * 1024) and CUT_MARK.format(n=5000 - 1024) in texts[0]
    dropped = sum(b.data.dropped_lines for b in done.batches)
    kept = sum(1 for t in texts if t == "y" * 90)
    assert kept + dropped == 200_000 and dropped > 190_000
    assert sum(len(t) for t in texts) < (64 << 10) * 1.2 + (16 << 10)  # burst, 0.2 s, a chunk
    meta = [t for b in done.batches for t, s in zip(b.data.text, b.data.stream, strict=True)
            if s == "meta"]
    assert meta and "dropped" in meta[0]
    assert pods.snapshot()["dropped_lines"] == dropped
    assert took < 5.0, f"a round over 20 MB took {took:.1f} s"


def test_an_unreadable_log_directory_is_not_every_pod_gone(tmp_path: Path) -> None:
    """A directory that cannot be listed for a moment (remounted) tells
    nothing: the pods stay followed, not finished and forgotten."""
    root, positions = tmp_path / "pods", tmp_path / "positions.json"
    name, w = make_worker(root, "train-7", 0)
    pods = agent(root, positions)
    pods.scan(time.time())
    pods.adopt(name, WorkerId("train-7", 1, 0), workers=1)
    w.print("before")
    pods.commit(pods.poll())
    root.rename(tmp_path / "away")
    assert pods.scan(time.time()) == []
    pods.commit(pods.poll())
    (tmp_path / "away").rename(root)
    w.print("after")
    pods.scan(time.time())
    done = pods.poll()
    assert [t for b in done.batches for t in b.data.text] == ["after"]
    assert set(pods.pods) == {name} and pods.finished == 0
