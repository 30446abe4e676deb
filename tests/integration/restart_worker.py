"""A worker for the scheduler restart test: records that it started (one
line per process, appended atomically), sleeps, and fails its first attempt
when asked to."""

import os
import sys
import time

marker, seconds, fail_first = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
env = os.environ
line = f"{env['PRIMUS_JOB_ID']} {env['PRIMUS_ATTEMPT']} {env['RANK']} {os.getpid()}\n"
fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, line.encode())
os.close(fd)
time.sleep(seconds)
sys.exit(1 if fail_first and os.environ["PRIMUS_ATTEMPT"] == "1" else 0)
