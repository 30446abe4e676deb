"""Helpers shared by tests (fixtures live in conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("primus-safe", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "cli.main"]
    return subprocess.run([*cmd, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
