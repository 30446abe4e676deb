"""CRI container log records and worker pod directories, read as data.

The record lines below are real CRI log lines. Sources of the format:
- the kubelet's reader, kubernetes/kubernetes pkg/kubelet/kuberuntime/logs/
  logs.go (``parseCRILog``), whose doc comment gives
  ``2016-10-06T00:17:09.669794202Z stdout P log content 1`` and
  ``2016-10-06T00:17:09.669794203Z stderr F log content 2``;
- the tag constants, kubernetes/cri-api pkg/apis/runtime/v1/constants.go:
  "First tag: Partial/Full - P/F", further tags after a ``:`` delimiter;
- the design, kubernetes/design-proposals-archive node/kubelet-cri-logging.md;
- CRI-O stamps its local offset instead of ``Z`` (``%Y-%m-%dT%H:%M:%S.%9N%:z``,
  as the OpenTelemetry collector's container parser documents).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.drivers.k8s_manifests import pod_name
from services.bench.cri_log import CriRecord, Joiner, parse_cri
from services.bench.pod_logs import WorkerId, match_pod, pod_of_dir

T0 = datetime(2016, 10, 6, 0, 17, 9, 669794, tzinfo=UTC).timestamp()

CASES: list[tuple[bytes, CriRecord | None]] = [
    (b"2016-10-06T00:17:09.669794202Z stdout P log content 1\n",
     CriRecord(T0, "stdout", True, b"log content 1")),
    (b"2016-10-06T00:17:09.669794203Z stderr F log content 2\n",
     CriRecord(T0, "stderr", False, b"log content 2")),
    # CRI-O: the node's offset, not Z (the same instant)
    (b"2016-10-06T02:17:09.669794202+02:00 stdout F log content 3\n",
     CriRecord(T0, "stdout", False, b"log content 3")),
    # further tags after ':' (forward compatible): only the first counts
    (b"2016-10-06T00:17:09.669794202Z stdout P:x partial with tags\n",
     CriRecord(T0, "stdout", True, b"partial with tags")),
    # an empty line the worker printed: the space after the tag is there
    (b"2016-10-06T00:17:09.669794202Z stdout F \n", CriRecord(T0, "stdout", False, b"")),
    # spaces inside the text are the text's
    (b"2016-10-06T00:17:09.669794202Z stdout F  two  spaces \n",
     CriRecord(T0, "stdout", False, b" two  spaces ")),
    # no newline (the last line read before the runtime finished it)
    (b"2016-10-06T00:17:09.669794202Z stderr F no newline",
     CriRecord(T0, "stderr", False, b"no newline")),
    # bytes that are not UTF-8 stay bytes here (the batcher escapes them)
    (b"2016-10-06T00:17:09.669794202Z stdout F \xff\xfe\n",
     CriRecord(T0, "stdout", False, b"\xff\xfe")),
    # not CRI: the docker json-file format, a bad stream, a missing tag, no offset
    (b'{"log":"x\\n","stream":"stdout","time":"2016-10-20T18:39:20.57606443Z"}\n', None),
    (b"2016-10-06T00:17:09.669794202Z stdin F x\n", None),
    (b"2016-10-06T00:17:09.669794202Z stdout F\n", None),
    (b"2016-10-06T00:17:09.669794202 stdout F no offset\n", None),
    (b"yesterday stdout F x\n", None),
    (b"", None),
]


@pytest.mark.parametrize(("line", "want"), CASES)
def test_parse_cri(line: bytes, want: CriRecord | None) -> None:
    got = parse_cri(line)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert (got.stream, got.partial, got.text) == (want.stream, want.partial, want.text)
    assert got.time == pytest.approx(want.time, abs=1e-6)


def records(*lines: bytes) -> list[CriRecord]:
    out = [parse_cri(b"2016-10-06T00:17:09.669794202Z " + line) for line in lines]
    assert all(r is not None for r in out)
    return out  # type: ignore[return-value]


def joined(joiner: Joiner, recs: list[CriRecord]) -> list[bytes]:
    return [line for rec in recs if (line := joiner.add(rec)) is not None]


def test_partial_records_join_into_one_line_per_stream() -> None:
    joiner = Joiner(max_bytes=1024)
    recs = records(b"stdout P hello ", b"stderr F an error between the pieces",
                   b"stdout P wide ", b"stdout F world", b"stdout F next")
    assert joined(joiner, recs) == [b"an error between the pieces", b"hello wide world",
                                    b"next"]
    assert joiner.open == {}


def test_a_line_past_the_limit_is_let_out_at_once_and_its_rest_skipped() -> None:
    joiner = Joiner(max_bytes=10)
    recs = records(b"stdout P 0123456", b"stdout P 789abcdef", b"stdout P ghij",
                   b"stdout F klm", b"stdout F after")
    # what came so far goes out (the batcher cuts it to 10 with its marker);
    # the rest up to the F record is not kept
    assert joined(joiner, recs) == [b"0123456789abcdef", b"after"]


def test_the_container_ending_says_its_unfinished_line() -> None:
    joiner = Joiner(max_bytes=100)
    assert joined(joiner, records(b"stdout P no newline at exit")) == []
    assert joiner.end() == [("stdout", b"no newline at exit")]
    assert joiner.end() == []


def test_pod_dirs_of_worker_pods_in_the_namespace_only() -> None:
    pod = pod_name("train-7", 2, 3)
    assert pod_of_dir(f"primus_{pod}_0b6d-4c1e", "primus") == pod
    assert pod_of_dir(f"default_{pod}_0b6d-4c1e", "primus") is None  # another namespace
    assert pod_of_dir("primus_primus-safe-scheduler-7d9f_0b6d", "primus") is None
    assert pod_of_dir(f"primus_{pod}", "primus") is None


@pytest.mark.parametrize("job", ["train-7", "Big_Job_42", "x" * 60, "a-a1-r2"])
def test_the_job_is_found_by_computing_its_pod_names(job: str) -> None:
    """Ids that are not DNS labels become a digest: the name is matched,
    never parsed back (``Big_Job_42`` and ``big-job-42`` differ)."""
    jobs = ["other", "big-job-42", job, "train-77"]
    assert match_pod(pod_name(job, 4, 11), jobs) == WorkerId(job, 4, 11)
    assert match_pod(pod_name(job, 4, 11), ["other"]) is None
    assert match_pod("not-a-worker-pod", jobs) is None
