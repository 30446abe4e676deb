"""The supervisor of one local worker: ``python -m libs.drivers.local_worker
EXIT_FILE PID_FILE TAG -- COMMAND...``.

It first writes PID_FILE (its own pid is the file name's, TAG the content),
so a scheduler that dies right after starting it still finds it. It runs the
training command as its child, forwards SIGTERM/SIGINT to it
(so the job can checkpoint and stop), and writes the child's exit code to
EXIT_FILE atomically when it ends. The code thus outlives the scheduler that
launched the worker: a restarted scheduler adopts running workers from their
pid files and learns how they ended from this file. A supervisor killed
together with its node leaves no file, which reads as killed (-9).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_exit(path: Path, code: int) -> None:
    write_atomic(path, f"{code}\n")


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print("usage: python -m libs.drivers.local_worker EXIT_FILE PID_DIR TAG -- COMMAND...",
              file=sys.stderr)
        return 2
    exit_file, pid_dir, tag, command = Path(argv[0]), Path(argv[1]), argv[2], argv[4:]
    pid_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(pid_dir / str(os.getpid()), f"{tag}\n")
    try:
        child = subprocess.Popen(command)
    except OSError as exc:  # gone (or changed) since the driver checked: a shell's codes
        code = 126 if isinstance(exc, PermissionError) else 127
        print(f"{'cannot run' if code == 126 else 'command not found'}: {command[0]} ({exc})",
              file=sys.stderr)
        write_exit(exit_file, code)
        return 1

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    write_exit(exit_file, code)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
