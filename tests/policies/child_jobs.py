"""Jobs for tests/policies/test_jobs.py to run in a process of their own, speaking the frames
of policies/replay_child.py: `python -m tests.policies.child_jobs`, a (kind, value) on stdin."""

import os
import pickle
import sys
import tempfile
import time

from policies.replay_child import write_frame

PID_FILE = os.path.join(tempfile.gettempdir(), "limiter-test-child-job.pid")


def main() -> None:
    kind, value = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    if kind == "count":
        for done in range(1, value + 1):
            write_frame(out, ("progress", done, value))
        write_frame(out, ("done", {"counted": value, "pid": os.getpid()}))
    elif kind == "sleep":
        with open(PID_FILE, "w") as pid:
            pid.write(str(os.getpid()))
        time.sleep(value)  # the work that outlasts its time
    elif kind == "divide":
        try:
            1 / value
        except ZeroDivisionError as error:
            write_frame(out, ("failed", f"{type(error).__name__}: {error}"))
    elif kind == "exit":
        sys.exit(value)


if __name__ == "__main__":
    main()
