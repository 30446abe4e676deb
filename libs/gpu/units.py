"""Small pure helpers that turn tool strings into numbers in base units.

Every tool spells "no reading" differently ("N/A", "[N/A]", "[Not Supported]",
"N/A (Secondary die)") and puts units in different places ("16.0GT/s", "54 %",
"(300Mhz)", "8176 MB"). These helpers centralise that so the parsers only map
fields, and so a value that is neither a number nor a known "no reading" marker
raises ``ToolOutputError`` naming the field.
"""

from __future__ import annotations

import json
import math
import re

from libs.gpu.model import ToolOutputError

_MISSING = re.compile(
    r"^\[?\s*(n/?a|not supported|not available|unknown|unknown error|"
    r"insufficient permissions|requested functionality has been deprecated|none|-)\s*\]?"
    r"(\s*\(.*\))?$",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")

# amd-smi prints "MB" but computes it as bytes // 2**20; nvidia-smi prints MiB.
_BYTE_FACTORS = {
    "b": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
}
# PCIe generation -> per-lane transfer rate in GT/s.
PCIE_GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def is_missing(value: object) -> bool:
    """True for None and every tool's spelling of "no reading"."""
    if value is None:
        return True
    if isinstance(value, str):
        text = value.strip()
        return not text or bool(_MISSING.match(text))
    return False


def number(value: object, *, tool: str, field: str) -> float | None:
    """The first number in ``value`` ("(300Mhz)" -> 300.0), or None if it is missing."""
    if is_missing(value):
        return None
    if isinstance(value, bool):
        raise ToolOutputError(tool, f"field {field!r} is a boolean, expected a number")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        match = _NUMBER.search(value)
        if match is None:
            raise ToolOutputError(tool, f"field {field!r} has non-numeric value {value!r}")
        result = float(match.group())
    else:
        raise ToolOutputError(tool, f"field {field!r} has unexpected {type(value).__name__}")
    if not math.isfinite(result):
        raise ToolOutputError(tool, f"field {field!r} is not finite: {value!r}")
    return result


def integer(value: object, *, tool: str, field: str) -> int | None:
    """Like ``number`` but for counts and indices."""
    result = number(value, tool=tool, field=field)
    return None if result is None else int(result)


def to_bytes(value: float | None, unit: str | None, *, tool: str, field: str) -> int | None:
    """Scale ``value`` given in ``unit`` (B, KB, MB/MiB, GB/GiB) to bytes."""
    if value is None:
        return None
    factor = _BYTE_FACTORS.get((unit or "b").strip().lower())
    if factor is None:
        raise ToolOutputError(tool, f"field {field!r} has unknown memory unit {unit!r}")
    return int(value * factor)


def pcie_gen_to_gts(gen: int | None) -> float | None:
    """Per-lane rate for a PCIe generation; None for unknown generations."""
    return None if gen is None else PCIE_GEN_GTS.get(gen)


def text(value: object) -> str | None:
    """A stripped string, or None for missing markers and non-strings."""
    if is_missing(value) or not isinstance(value, str | int):
        return None
    return str(value).strip()


def load_json(raw: str, *, tool: str) -> object:
    """Decode a tool's JSON, skipping any warning lines printed before it.

    amd-smi and rocm-smi sometimes print "WARNING: ..." on stdout ahead of the
    document; the JSON starts at the first line that opens an object or array.
    """
    if not raw or not raw.strip():
        raise ToolOutputError(tool, "no output")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as first_error:
        start = re.search(r"^[\[{]", raw, re.MULTILINE)
        if start is not None and start.start() > 0:
            try:
                return json.loads(raw[start.start() :])
            except json.JSONDecodeError:
                pass
        raise ToolOutputError(tool, f"output is not JSON ({first_error})") from first_error
