"""The supervisor of one local worker: ``python -m libs.drivers.local_worker
EXIT_FILE PID_DIR TAG [--log FILE [--log-limits JSON]] -- COMMAND...``.

It first writes PID_FILE (its own pid is the file name's, TAG the content),
so a scheduler that dies right after starting it still finds it. It runs the
training command as its child, forwards SIGTERM/SIGINT to it
(so the job can checkpoint and stop), and writes the child's exit code to
EXIT_FILE atomically when it ends. The code thus outlives the scheduler that
launched the worker: a restarted scheduler adopts running workers from their
pid files and learns how they ended from this file. A supervisor killed
together with its node leaves no file, which reads as killed (-9).

With ``--log`` it reads the worker's stdout and stderr itself: into FILE,
rotated at the limits' size, and, when the worker's environment names a bus
(``PRIMUS_NATS_URL``), in batches to Lens with the job's own credential
(``worker_output``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_exit(path: Path, code: int) -> None:
    write_atomic(path, f"{code}\n")


SEND_WAIT_S = 30.0  # after the worker ended, for its last output to reach the bus


def _parse(argv: list[str]) -> argparse.Namespace | None:
    if "--" not in argv:
        return None
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m libs.drivers.local_worker")
    parser.add_argument("exit_file", type=Path)
    parser.add_argument("pid_dir", type=Path)
    parser.add_argument("tag")
    parser.add_argument("--log", type=Path, help="the rank's log file")
    parser.add_argument("--log-limits", default="{}", help="LogLimits as JSON")
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1:]
    return args if args.command else None


def _output(log: Path, limits_json: str) -> tuple[Any, Any]:
    """The pump for the worker's streams and the publisher it ships with
    (None without a bus, or when shipping is off)."""
    from libs.drivers.worker_output import OutputPump, RotatingFile
    from libs.log_shipper import Batcher, LogLimits
    from libs.sdk import TelemetryPublisher
    from libs.worker_env import WorkerEnv

    limits = LogLimits.model_validate_json(limits_json)
    env = WorkerEnv.from_env()
    publisher = batcher = None
    if limits.ship and env.nats_url:
        publisher = TelemetryPublisher(env.nats_url, env.nats_token, 64, job=env.job,
                                       name="primus-worker-log", user=env.nats_user,
                                       password=env.nats_password)
        publisher.start()
        batcher = Batcher.for_worker(env.job, env.attempt, env.rank, env.node, env.world_size,
                                     limits, source=f"local-worker/{env.node}")
    file = RotatingFile(log, limits.file_max_bytes, limits.file_keep)
    return OutputPump(file, batcher, publisher), publisher


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args is None:
        print("usage: python -m libs.drivers.local_worker EXIT_FILE PID_DIR TAG "
              "[--log FILE [--log-limits JSON]] -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, pid_dir, tag, command = args.exit_file, args.pid_dir, args.tag, args.command
    pid_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(pid_dir / str(os.getpid()), f"{tag}\n")
    pump = publisher = None
    if args.log is not None:
        pump, publisher = _output(args.log, args.log_limits)
    pipe = subprocess.PIPE if pump is not None else None
    try:
        child = subprocess.Popen(command, stdout=pipe, stderr=pipe)
    except OSError as exc:  # gone (or changed) since the driver checked: a shell's codes
        code = 126 if isinstance(exc, PermissionError) else 127
        message = (f"{'cannot run' if code == 126 else 'command not found'}: {command[0]} "
                   f"({exc})\n")
        if pump is not None:
            pump.file.write(message.encode())
            pump.file.close()
        else:
            sys.stderr.write(message)
        write_exit(exit_file, code)
        return 1
    if pump is not None:
        pump.start({"stdout": child.stdout, "stderr": child.stderr})

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = child.wait()
    if pump is not None:
        pump.finish()
    # The exit is recorded before the last batches go out: the driver
    # reports it from this file and does not wait on the bus.
    write_exit(exit_file, code)
    if publisher is not None:
        # A bus never reached is not waited for long: nothing would get out.
        publisher.close(SEND_WAIT_S if publisher.reached else 2.0)
        lost = publisher.failed + publisher.dropped + publisher.queue.qsize() \
            + (pump.unsent if pump is not None else 0)
        if lost and pump is not None:  # said where the operator reads the output
            with open(pump.file.path, "ab") as log:
                log.write(f"primus-safe: {lost} batch(es) of this output did not reach Lens "
                          f"(the bus was away or slow)\n".encode())
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
