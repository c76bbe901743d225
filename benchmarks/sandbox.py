"""What the bubblewrap sandbox adds to one command (contract §4.4): `true` through run_operation.

Runs the same `true` request unconfined and sandboxed, interleaved call by call so both see
the same load, and reports each one's p50 and p99 and the difference at each percentile. The
sandbox is the one a worker builds (workspaces/sandbox.py: namespaces, hidden worker files,
prlimit, read-only git metadata), on a scratch git checkout of its own with one linked-worktree
lane, as a worker's workspaces are. Needs no database or Redis.

    .venv/bin/python benchmarks/sandbox.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workspaces.hostgit import run_git
from workspaces.operations import Confinement, run_operation
from workspaces.sandbox import worker_sandbox


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    calls = parser.parse_args().calls
    root = os.path.realpath(tempfile.mkdtemp(prefix="sluice-bench-sandbox-"))
    try:
        identity = ("-c", "user.name=bench", "-c", "user.email=bench@sluice.invalid")
        run_git(root, "init", "-q", "-b", "main")
        run_git(root, *identity, "commit", "-q", "--allow-empty", "-m", "initial")
        run_git(root, "worktree", "add", "-q", ".worktrees/lane", "-b", "lane")
        sandbox = worker_sandbox(
            base_dir=str(Path(__file__).resolve().parent.parent), workspace_roots=[root]
        )
        confined = Confinement(sandbox, root)
        request: dict[str, object] = {
            "protocolVersion": 1,
            "operation": "execute_command",
            "workspaceId": "bench",
            "command": "true",
            "cwd": "",
            "timeoutMs": 30_000,
            "maxOutputBytes": 1024,
        }
        timings: dict[str, list[float]] = {"none": [], "bwrap": []}
        for _ in range(calls):
            for profile, confinement in (("none", None), ("bwrap", confined)):
                started = time.perf_counter()
                result = run_operation(
                    request, root=root, deadline=time.monotonic() + 30, confinement=confinement
                )
                timings[profile].append((time.perf_counter() - started) * 1000)
                assert result["exitCode"] == 0, result
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{calls} calls of `true` each, interleaved (ms)")
    print(f"{'':10} {'p50':>8} {'p99':>8} {'mean':>8}")
    for profile, samples in timings.items():
        print(
            f"{profile:10} {percentile(samples, 0.5):8.2f} {percentile(samples, 0.99):8.2f} "
            f"{statistics.fmean(samples):8.2f}"
        )
    added = {
        q: percentile(timings["bwrap"], q) - percentile(timings["none"], q) for q in (0.5, 0.99)
    }
    print(f"{'added':10} {added[0.5]:8.2f} {added[0.99]:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
