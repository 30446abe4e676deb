"""Reading Alibaba's GPU cluster trace (cluster-trace-gpu-v2023) into the
scheduler's nodes and tasks, for ``scheduler_trace.py``.

The node list gives each node's GPU count and model (``sn``, ``gpu``,
``model``); a pod list gives each task's GPUs (``num_gpu``, ``gpu_milli``),
the GPU models it is pinned to (``gpu_spec``, ``|``-separated), its QoS and
its times (``creation_time``, ``scheduled_time``, ``deletion_time``).
Resampled pod lists without times or QoS borrow them by pod name from the
``..._default.csv`` list next to them. A file that cannot be used raises
``TraceError``, whose message names the file, the line or column and the fix.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.scheduler.policy import (
    ClusterState,
    Invalid,
    Job,
    Node,
    SchedulerConfig,
    Workspace,
    build_request,
)

QOS_PRIORITY = {"LS": "high", "Guaranteed": "medium", "Burstable": "medium", "BE": "low"}
WORKSPACE = Workspace("openb", queue_policy="balance")
"""Every task runs in one balance queue (the trace has no tenants)."""
NEVER_FITS = ("no-node", "too-big")
"""``Invalid`` codes of a job no ready node could ever hold."""


@dataclass(frozen=True)
class Task:
    job: Job
    arrival: float
    duration: float


class TraceError(ValueError):
    """A trace file the replay cannot use; the message names the file, the
    line or column, and the fix."""


NODE_COLUMNS = ("sn", "gpu", "model")
POD_COLUMNS = ("name", "num_gpu", "gpu_milli")
TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
SOURCE = "of Alibaba's cluster-trace-gpu-v2023 (github.com/alibaba/clusterdata)"
NODE_LIST = f"the node list (*_node_list_gpu_node.csv) {SOURCE}"
POD_LIST = f"a pod list (*_pod_list_*.csv) {SOURCE}"


def _rows(path: Path, columns: tuple[str, ...],
          what: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV whose header has ``columns``; ``what``
    the file should be, for the error."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise TraceError(
                    f"{path}: no column {', '.join(missing)} in the header "
                    f"({', '.join(header) or 'empty file'}); pass {what}, with the columns "
                    f"{', '.join(columns)}")
            return [(reader.line_num, row) for row in reader]
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        raise TraceError(f"{path}: {e.strerror.lower()}; pass {what}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise TraceError(f"{path}: not a CSV text file ({e}); pass {what}") from None


def _number(path: Path, line: int, row: dict[str, str], column: str, kind: type = int,
            *, low: float = 0) -> Any:
    """``row[column]`` as ``kind`` (>= ``low``), or a TraceError naming the cell."""
    text = (row.get(column) or "").strip()
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not value >= low:
        what = "a whole number" if kind is int else "a finite number"
        raise TraceError(f"{path}:{line}: {column}={text!r} is not {what} >= {low:g}; "
                         f"correct that row or delete it")
    return value


def _first(path: Path, line: int, kind: str, name: str, seen: dict[str, int]) -> None:
    """Record ``name`` at ``line``, or a TraceError if an earlier row had it."""
    if name in seen:
        raise TraceError(f"{path}:{line}: {kind} {name} is listed again (first on line "
                         f"{seen[name]}); keep one row per {kind}")
    seen[name] = line


def load_nodes(path: Path, *, rack_size: int, fraction: float) -> list[Node]:
    rows = _rows(path, NODE_COLUMNS, NODE_LIST)
    seen: dict[str, int] = {}
    for line, row in rows:
        name = (row.get("sn") or "").strip()
        if not name or not (row.get("model") or "").strip():
            raise TraceError(f"{path}:{line}: a node needs an sn and a model; "
                             f"correct that row or delete it")
        _first(path, line, "node", name, seen)
        _number(path, line, row, "gpu")
    rows.sort(key=lambda r: r[1]["sn"])
    step = max(1, round(1 / fraction))
    rows = rows[::step]
    nodes = []
    for i, (_, row) in enumerate(rows):
        r = i // rack_size
        ip = f"10.{r // 250}.{r % 250}.{i % rack_size + 1}"
        nodes.append(Node(row["sn"].strip(), int(row["gpu"]), row["model"].strip(),
                          rack=f"rack{r:03d}", switch=f"sw{r // 8:02d}", ip=ip))
    if not any(n.gpus for n in nodes):
        raise TraceError(f"{path}: no node with GPUs among the {len(nodes)} of {len(seen)} "
                         f"kept; pass the GPU node list or a larger --node-fraction")
    return nodes


def load_tasks(path: Path, *, speedup: float, min_runtime_s: float,
               load: float = 1.0) -> tuple[list[Task], dict]:
    rows = _rows(path, POD_COLUMNS, POD_LIST)
    borrowed = 0
    if rows and "creation_time" not in rows[0][1]:
        donor_path = path.with_name(path.name.rsplit("_pod_list_", 1)[0] + "_pod_list_default.csv")
        if not donor_path.exists():
            raise TraceError(
                f"{path}: no {', '.join(TIME_COLUMNS)} columns, and no {donor_path.name} next "
                f"to it to borrow them from by pod name; put the default pod list there or "
                f"add those columns")
        donors = {}
        for line, r in _rows(donor_path, (*POD_COLUMNS, *TIME_COLUMNS), POD_LIST):
            for column in TIME_COLUMNS:  # bad times are reported where they are written
                if (r.get(column) or "").strip():
                    _number(donor_path, line, r, column, float)
            donors[r["name"]] = r
        if not donors:
            raise TraceError(f"{donor_path}: no pods to borrow times from for {path.name}; "
                             f"pass the trace's full default pod list")
        keep = ("gpu_spec", "qos", "pod_phase", *TIME_COLUMNS)
        for _, row in rows:
            donor = donors.get(row["name"])
            if donor is None:  # resampled pods without a twin borrow a fixed other row
                donor = donors[sorted(donors)[hash_index(row["name"], len(donors))]]
            row.update({k: donor.get(k, "") for k in keep})
            borrowed += 1
    elif rows:
        missing = [c for c in TIME_COLUMNS if c not in rows[0][1]]
        if missing:
            raise TraceError(f"{path}: no column {', '.join(missing)} in the header; a pod "
                             f"list has all of {', '.join(TIME_COLUMNS)} or none")
    tasks, skipped = [], {"fractional_or_cpu": 0, "never_scheduled": 0}
    seen: dict[str, int] = {}
    whole = []
    for line, row in rows:
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: a pod needs a name; correct that row or delete it")
        _first(path, line, "pod", name, seen)
        gpus = _number(path, line, row, "num_gpu")
        milli = _number(path, line, row, "gpu_milli")
        if gpus < 1 or (milli != 1000 and gpus <= 1):
            skipped["fractional_or_cpu"] += 1
            continue
        if not (row.get("scheduled_time") or "").strip():
            skipped["never_scheduled"] += 1
            continue
        whole.append((line, row, name, gpus))
    if not whole:
        raise TraceError(
            f"{path}: no whole-GPU task to replay (num_gpu >= 1 with gpu_milli 1000, or "
            f"num_gpu > 1, and a scheduled_time) among {len(rows)} pods; pass {POD_LIST}")
    # Time 0 is the trace's first creation, of any pod (as recorded).
    created = {line: _number(path, line, row, "creation_time", float)
               for line, row in rows if (row.get("creation_time") or "").strip()}
    start = min(created.values())
    for line, row, name, gpus in whole:
        if line not in created:
            raise TraceError(f"{path}:{line}: pod {name} was scheduled but has no "
                             f"creation_time; correct that row or delete it")
        arrival = (created[line] - start) / speedup / load
        ended = _number(path, line, row, "deletion_time", float)
        duration = max(1.0, ended - _number(path, line, row, "scheduled_time", float))
        spec = row.get("gpu_spec") or ""
        prio = QOS_PRIORITY.get(row.get("qos", ""), "medium")
        job = Job(name, WORKSPACE.name, 1, gpus, prio, arrival,
                  min_runtime_s=min_runtime_s, preemptible=prio != "high",
                  gpu_models=frozenset(m.strip() for m in spec.split("|") if m.strip()))
        tasks.append(Task(job, arrival, duration))
    tasks.sort(key=lambda t: (t.arrival, t.job.id))
    return tasks, {**skipped, "borrowed_times_and_qos": borrowed}


def placeable(nodes: list[Node], tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    """The tasks the scheduler could place on the kept nodes once they are
    empty, and the rest: those it refuses for good (``build_request``'s
    ``no-node`` and ``too-big``: pinned to GPU models none of the kept
    nodes has, or larger than every such node). The rest would wait forever
    under every scheduler and keep the queue non-empty to the end, so they
    are left out and counted."""
    state = ClusterState.from_snapshot(nodes, [WORKSPACE], [])
    config = SchedulerConfig()
    fits, never = [], []
    for t in tasks:
        try:
            build_request(t.job, state, config)
        except Invalid as bad:
            if bad.code not in NEVER_FITS:
                raise
            never.append(t)
        else:
            fits.append(t)
    return fits, never


def hash_index(name: str, n: int) -> int:
    value = 0
    for ch in name:
        value = (value * 131 + ord(ch)) % 2_147_483_647
    return value % n
