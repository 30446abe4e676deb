"""Find a GPU tool on this node, run it with a timeout, and parse what it says.

This is the only module in ``libs.gpu`` with side effects (PATH lookup,
subprocesses, reading /sys); the parsers it calls are pure. A health probe must
always get an answer, so nothing here raises: a missing tool or a timeout is an
"unavailable" result with the reason, a tool that fails or prints nonsense is an
"error" result, and every tool tried leaves one line in ``attempts``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from libs.gpu.amd_smi import parse_amd_smi_json, parse_amd_smi_version
from libs.gpu.model import GpuInventory, ProbeResult, ToolOutputError
from libs.gpu.nvidia_smi import QUERY_FIELDS, parse_nvidia_smi_csv
from libs.gpu.rocm_smi import parse_rocm_smi
from libs.gpu.sysfs import read_amdgpu_sysfs

DEFAULT_TOOLS: tuple[str, ...] = ("amd-smi", "rocm-smi", "nvidia-smi")
NVIDIA_QUERY_ARGS: tuple[str, ...] = (
    f"--query-gpu={','.join(QUERY_FIELDS)}",
    "--format=csv,noheader,nounits",
)

Which = Callable[[str], str | None]


class _Unavailable(Exception):
    """The tool could not be run at all (timeout, not executable)."""


class _Failed(Exception):
    """The tool ran but exited non-zero."""


@dataclass(frozen=True)
class _Runner:
    path: str
    timeout_s: float

    def __call__(self, *args: str) -> str:
        argv = [self.path, *args]
        shown = " ".join([Path(self.path).name, *args])
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise _Unavailable(f"`{shown}` timed out after {self.timeout_s:g}s") from error
        except OSError as error:
            raise _Unavailable(f"`{shown}` could not be run: {error}") from error
        if done.returncode != 0:
            detail = (done.stderr or done.stdout or "").strip().splitlines()
            tail = detail[-1][:200] if detail else "no output"
            raise _Failed(f"`{shown}` exited with {done.returncode}: {tail}")
        return done.stdout


def probe_gpus(
    tool_preference: Sequence[str] = DEFAULT_TOOLS,
    timeout_s: float = 5.0,
    *,
    sysfs_root: str | os.PathLike[str] | None = "/",
    which: Which = shutil.which,
) -> ProbeResult:
    """Inventory this node's GPUs with the first tool in ``tool_preference`` that works.

    Each tool command gets ``timeout_s``. If no tool works and ``sysfs_root`` is
    set, AMD GPUs are read from sysfs under it. Never raises.
    """
    attempts: list[str] = []
    saw_error = False
    for tool in tool_preference:
        path = which(tool)
        if path is None:
            attempts.append(f"{tool}: not found on PATH")
            continue
        collect = _COLLECTORS.get(tool)
        if collect is None:
            attempts.append(f"{tool}: no parser for this tool")
            continue
        try:
            inventory = collect(_Runner(path, timeout_s))
        except _Unavailable as why:
            attempts.append(f"{tool}: {why}")
            continue
        except _Failed as why:
            saw_error = True
            attempts.append(f"{tool}: {why}")
            continue
        except ToolOutputError as why:
            saw_error = True
            attempts.append(f"{tool}: {why.detail}")
            continue
        except Exception as why:
            # A parser bug must not take the health probe down with it.
            saw_error = True
            attempts.append(f"{tool}: unexpected {type(why).__name__}: {why}")
            continue
        attempts.append(f"{tool}: ok, {len(inventory.gpus)} GPU(s)")
        return ProbeResult(status="ok", tool=tool, inventory=inventory, attempts=tuple(attempts))

    if sysfs_root is not None:
        from_sysfs, note = _read_sysfs(sysfs_root)
        attempts.append(note)
        if from_sysfs is not None:
            return ProbeResult(
                status="ok", tool="sysfs", inventory=from_sysfs, attempts=tuple(attempts)
            )
    if not attempts:
        attempts.append("no tools requested")
    return ProbeResult(
        status="error" if saw_error else "unavailable",
        reason="; ".join(attempts),
        attempts=tuple(attempts),
    )


def _read_sysfs(root: str | os.PathLike[str]) -> tuple[GpuInventory | None, str]:
    """The sysfs inventory if it found AMD GPUs, and the line for ``attempts``."""
    try:
        inventory = read_amdgpu_sysfs(root)
    except Exception as why:
        return None, f"sysfs: unexpected {type(why).__name__}: {why}"
    if not inventory.gpus:
        return None, "sysfs: no amdgpu devices"
    return inventory, f"sysfs: ok, {len(inventory.gpus)} GPU(s)"


def _collect_amd_smi(run: _Runner) -> GpuInventory:
    """``metric`` is required; ``static`` (names, caps) and ``version`` are best effort."""
    inventory = parse_amd_smi_json(run("metric", "--json"))
    with contextlib.suppress(_Unavailable, _Failed, ToolOutputError):
        inventory = inventory.merged_with(parse_amd_smi_json(run("static", "--json")))
    try:
        version = parse_amd_smi_version(run("version"))
    except (_Unavailable, _Failed):
        version = None
    return inventory.model_copy(update={"tool_version": version}) if version else inventory


def _collect_rocm_smi(run: _Runner) -> GpuInventory:
    """The JSON dump first; the concise table if this rocm-smi cannot do JSON."""
    try:
        return parse_rocm_smi(run("--showallinfo", "--json"))
    except (_Failed, ToolOutputError):
        return parse_rocm_smi(run())


def _collect_nvidia_smi(run: _Runner) -> GpuInventory:
    return parse_nvidia_smi_csv(run(*NVIDIA_QUERY_ARGS), QUERY_FIELDS)


_COLLECTORS: dict[str, Callable[[_Runner], GpuInventory]] = {
    "amd-smi": _collect_amd_smi,
    "rocm-smi": _collect_rocm_smi,
    "nvidia-smi": _collect_nvidia_smi,
}
