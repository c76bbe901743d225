"""The undertaker (workspaces/operations/undertaker.py): once a worker process is killed,
every process still carrying its sandbox mark is killed, including one that only takes the
mark after the worker died (a bwrap forked just before, executed just after), and nothing
else is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from livesupport import ROOT, pid_alive, wait_until

from workspaces.sandbox import MARK_ENV

WORKER = """
import os, subprocess, sys
from workspaces.operations import undertaker

marked = dict(os.environ, **undertaker.mark())
token = marked[sys.argv[1]]
late = f"while kill -0 {os.getpid()}; do sleep 0.01; done; exec env {sys.argv[1]}={token} sleep 600"
kids = [
    subprocess.Popen(["sleep", "600"], env=marked),
    subprocess.Popen(["sleep", "600"], env=marked, start_new_session=True),
    subprocess.Popen(["sh", "-c", late], start_new_session=True),
]
print(" ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
"""


def test_a_killed_workers_marked_processes_are_killed_and_nothing_else(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'protocol'}")
    others = [
        subprocess.Popen(["sleep", "600"], env=dict(env, **{MARK_ENV: "another-workers"})),
        subprocess.Popen(["sleep", "600"], env=env),
    ]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, MARK_ENV],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    marked: list[int] = []
    try:
        assert worker.stdout is not None
        marked = [int(pid) for pid in worker.stdout.readline().split()]
        assert len(marked) == 3 and all(pid_alive(pid) for pid in marked)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        wait_until(lambda: not any(pid_alive(pid) for pid in marked))
        assert all(other.poll() is None for other in others)
    finally:
        worker.kill()
        worker.wait()
        for pid in marked:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for other in others:
            other.kill()
            other.wait()
