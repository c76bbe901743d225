"""A worker killed while it starts a sandbox: how often something of the sandbox is left.

Each round starts a process that prepares sandboxes as a worker does (workspaces/operations/
prepared.py, marked with a worker id), SIGKILLs it at a random moment within its first 20 ms
(while bwrap is starting), and looks 0.3 s later for processes still carrying that worker's
prepared-sandbox mark; any found are counted and killed. Before the undertaker
(workspaces/operations/undertaker.py), bwrap's --die-with-parent race (bubblewrap#633) left
one in about 1 round of 5 here.

    .venv/bin/python benchmarks/sandbox_kill.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workspaces.operations.prepared import PREPARED_ENV
from workspaces.runtime.orphans import orphaned_pids

ROOT = Path(__file__).resolve().parent.parent

WORKER_ID = f"bench-kill-{os.getpid()}"
PREPARING = """
import sys, time
from workspaces.operations import prepared
from workspaces.sandbox import worker_sandbox

root, base, worker_id = sys.argv[1:4]
sandbox = worker_sandbox(base_dir=base, workspace_roots=[root])
print("go", flush=True)
prepared.prepare(prepared.SandboxKey(sandbox, root, None, True), root=root,
                 env={prepared.PREPARED_ENV: worker_id})
time.sleep(60)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    root = os.path.realpath(tempfile.mkdtemp(prefix="sluice-bench-kill-"))
    base = tempfile.mkdtemp(prefix="sluice-bench-kill-code-")
    subprocess.run(["git", "init", "-q", root], check=True)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'protocol'}")
    left_rounds = 0
    for _ in range(args.rounds):
        worker = subprocess.Popen(
            [sys.executable, "-c", PREPARING, root, base, WORKER_ID],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert worker.stdout is not None
        worker.stdout.readline()
        time.sleep(random.uniform(0, 0.02))
        worker.kill()
        worker.wait()
        time.sleep(0.3)
        left = orphaned_pids(WORKER_ID, name=PREPARED_ENV)
        if left:
            left_rounds += 1
            for pid in left:
                os.kill(pid, signal.SIGKILL)
    # The undertakers' last scans end a second after their worker.
    time.sleep(1.5)
    late = orphaned_pids(WORKER_ID, name=PREPARED_ENV)
    print(f"rounds that left a sandbox process behind: {left_rounds} of {args.rounds}")
    print(f"left after every undertaker had finished: {len(late)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
