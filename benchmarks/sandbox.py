"""What the bubblewrap sandbox adds to one command (contract §4.4), and to the hand-off between
two commands on one workspace.

1. Per call: the same `true` request through run_operation unconfined, in a sandbox started at
   the call ("cold": what every command paid before sandboxes were prepared) and in the
   sandbox prepared while the previous command ran, interleaved call by call so all three see
   the same load; p50, p99 and the difference over unconfined.
2. Hand-off: the gap between one command's end and the next one's start, by the commands' own
   clocks (`benchmarks/admission.py`'s hand-off command), with the commands started back to
   back by a plain shell loop (`for ...; do sh -c ...; done`, no sandbox), by execute_command
   in cold sandboxes, and in prepared ones; rounds alternate. "Added" is a percentile minus
   the shell loop's: the sandbox's share of what issue 37 asks to keep within 3 ms (p50).

The sandbox is the one a worker builds (workspaces/sandbox.py: namespaces, hidden worker files,
prlimit, read-only git metadata), on a scratch git checkout with one linked-worktree lane, as a
worker's workspaces are. Needs no database or Redis.

    .venv/bin/python benchmarks/sandbox.py [--calls N] [--gaps N] [--rounds N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workspaces.hostgit import run_git
from workspaces.operations import Confinement, prepared, run_operation
from workspaces.sandbox import Sandbox, worker_sandbox

HANDOFF_COMMAND = "echo $(date +%s%N); echo $(date +%s%N)"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _request(command: str) -> dict[str, object]:
    return {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "bench",
        "command": command,
        "cwd": "",
        "timeoutMs": 30_000,
        "maxOutputBytes": 4096,
    }


def _gaps(spans: list[tuple[int, int]]) -> list[float]:
    return [(b[0] - a[1]) / 1e6 for a, b in itertools.pairwise(spans)]


def _spans(stdout: str) -> list[tuple[int, int]]:
    stamps = [int(x) for x in stdout.split()]
    return list(zip(stamps[::2], stamps[1::2], strict=True))


def shell_loop_gaps(root: str, calls: int) -> list[float]:
    loop = f"for i in $(seq {calls}); do sh -c {shlex.quote(HANDOFF_COMMAND)}; done"
    done = subprocess.run(["sh", "-c", loop], cwd=root, capture_output=True, text=True, check=True)
    return _gaps(_spans(done.stdout))


def sandbox_gaps(root: str, calls: int, confinement: Confinement) -> list[float]:
    spans: list[tuple[int, int]] = []
    for _ in range(calls):
        result = run_operation(
            _request(HANDOFF_COMMAND),
            root=root,
            deadline=time.monotonic() + 60,
            confinement=confinement,
        )
        spans += _spans(str(result["stdout"]))
    return _gaps(spans)


def per_call(root: str, sandbox: Sandbox, calls: int) -> dict[str, list[float]]:
    # A prepared sandbox is started during its key's previous command and then has the other
    # two profiles' calls to come up, as it would have a hand-off's.
    profiles = {
        "none": None,
        "cold": Confinement(sandbox, root, prepared=False),
        "prepared": Confinement(sandbox, root),
    }
    timings: dict[str, list[float]] = {name: [] for name in profiles}
    for _ in range(calls):
        for name, confinement in profiles.items():
            started = time.perf_counter()
            result = run_operation(
                _request("true"), root=root, deadline=time.monotonic() + 30, confinement=confinement
            )
            timings[name].append((time.perf_counter() - started) * 1000)
            assert result["exitCode"] == 0, result
    return timings


def table(title: str, timings: dict[str, list[float]], base: str) -> None:
    print(title)
    print(f"{'':26} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, samples in timings.items():
        print(
            f"{name:26} {percentile(samples, 0.5):8.2f} {percentile(samples, 0.99):8.2f} "
            f"{statistics.fmean(samples):8.2f}"
        )
    for name, samples in timings.items():
        if name == base:
            continue
        p50 = percentile(samples, 0.5) - percentile(timings[base], 0.5)
        p99 = percentile(samples, 0.99) - percentile(timings[base], 0.99)
        print(f"{'added: ' + name:26} {p50:8.2f} {p99:8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--gaps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = os.path.realpath(tempfile.mkdtemp(prefix="sluice-bench-sandbox-"))
    try:
        identity = ("-c", "user.name=bench", "-c", "user.email=bench@sluice.invalid")
        run_git(root, "init", "-q", "-b", "main")
        run_git(root, *identity, "commit", "-q", "--allow-empty", "-m", "initial")
        run_git(root, "worktree", "add", "-q", ".worktrees/lane", "-b", "lane")
        sandbox = worker_sandbox(
            base_dir=str(Path(__file__).resolve().parent.parent), workspace_roots=[root]
        )
        timings = per_call(root, sandbox, args.calls)
        gaps: dict[str, list[float]] = {"shell loop": [], "cold sandbox": [], "prepared": []}
        per_round = args.gaps // args.rounds
        for _ in range(args.rounds):
            gaps["shell loop"] += shell_loop_gaps(root, per_round)
            gaps["cold sandbox"] += sandbox_gaps(
                root, per_round, Confinement(sandbox, root, prepared=False)
            )
            gaps["prepared"] += sandbox_gaps(root, per_round, Confinement(sandbox, root))
            prepared.discard_all()
    finally:
        prepared.discard_all()
        shutil.rmtree(root, ignore_errors=True)
    table(f"{args.calls} calls of `true` each, interleaved (ms)", timings, "none")
    print()
    table(
        f"gap between consecutive commands, {args.rounds} alternating rounds (ms)",
        gaps,
        "shell loop",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
