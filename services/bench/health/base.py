"""The node-health catalogue's common parts: what a probe is given, what it
says, and how one is described (fault kind, severity, default schedule).

A probe is a pure-ish function of a ``ProbeContext``: files under ``root``
(the host's ``/``; tests point it at a fake tree), a ``run`` that runs one
tool with a timeout, ``state`` it keeps between its runs on this node (a
kernel-log cursor, the last AER counters) and its configured ``options``.
It returns a ``Finding``:

- ``ok`` / ``failed`` with a one-line detail naming what is wrong;
- ``unknown`` when it could not tell (the tool is missing, timed out, or
  printed something its parser does not understand): counts toward nothing;
- ``not_applicable`` when the node has nothing to check (no InfiniBand
  device, no NVMe drive, no GPU): never a failure, on any machine.

Parsers are separate pure functions over the tools' text (tested on
recorded real outputs, cited in tests/bench_agent/fixtures/health/README.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "failed", "unknown", "not_applicable"]
Severity = Literal["critical", "warning"]
# quarantine: a failing streak is a failed bench result (failover's
# probe_failed fault takes the node out of service); report: logged and
# counted (primus_bench_probe_reports_total) for the operator's alerting.
Action = Literal["quarantine", "report"]


@dataclass(frozen=True)
class Finding:
    status: Status
    detail: str = ""


class ToolUnavailable(Exception):
    """The tool is not installed, timed out, or could not be run: ``unknown``."""


@dataclass(frozen=True)
class ToolOutput:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], ToolOutput]


def run_tool(argv: Sequence[str], timeout_s: float) -> ToolOutput:
    """Run a tool; ToolUnavailable when it is missing or overruns."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise ToolUnavailable(f"{argv[0]}: not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ToolUnavailable(f"{argv[0]}: no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ToolUnavailable(f"{argv[0]}: {exc}") from exc
    return ToolOutput(done.returncode, done.stdout, done.stderr)


@dataclass
class ProbeContext:
    root: Path = Path("/")
    run: Runner = run_tool
    state: dict[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0

    def path(self, *parts: str) -> Path:
        """A host path under ``root`` (``ctx.path("sys/class/infiniband")``)."""
        return self.root.joinpath(*parts)

    def read(self, *parts: str, strip: bool = True) -> str | None:
        """A host file's text under ``root``; None when it cannot be read."""
        return read_text(self.path(*parts), strip=strip)

    def output(self, argv: Sequence[str]) -> str:
        """A tool's stdout; ToolUnavailable when it cannot run or exits non-zero
        (the probe then says ``unknown``, with this reason)."""
        done = self.run(argv, self.timeout_s)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:200]
            raise ToolUnavailable(f"{argv[0]}: exit {done.returncode}: {said}")
        return done.stdout


def read_text(path: Path, *, strip: bool = True) -> str | None:
    """A sysfs/procfs file's text (None when it is missing or unreadable:
    files differ between kernels and containers)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text.strip() if strip else text


@dataclass(frozen=True)
class HealthProbe:
    """One catalogue entry: the probe, the fault it opens, how bad it is, and
    its default schedule (``interval_s``, ``consecutive`` failures before it
    is reported, ``action`` then)."""

    kind: str
    run: Callable[[ProbeContext], Finding]
    fault: str
    severity: Severity
    interval_s: float
    consecutive: int
    action: Action
    summary: str
    options: Mapping[str, Any] = field(default_factory=dict)  # defaults, documented in summary
