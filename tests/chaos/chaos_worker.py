"""A training worker for the chaos tests: it records that this process
started (``job attempt rank node pid``, one line appended atomically to the
marker file), then becomes ``examples/train_tiny.py`` by exec, so the pid,
the signals and the exit code are the training job's own.

Usage: ``python tests/chaos/chaos_worker.py MARKER [train_tiny args...]``.
"""

import os
import sys
from pathlib import Path

marker, *args = sys.argv[1:]
env = os.environ
line = (f"{env['PRIMUS_JOB_ID']} {env['PRIMUS_ATTEMPT']} {env['RANK']} "
        f"{env['PRIMUS_NODE_NAME']} {os.getpid()}\n")
fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, line.encode())
os.close(fd)
train = Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"
os.execv(sys.executable, [sys.executable, str(train), *args])
