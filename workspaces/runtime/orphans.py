"""Commands a killed worker left running, found and killed when it starts again.

A command leads its own session (workspaces/operations/command.py), so when its worker dies
with SIGKILL nothing stops it; the restarted worker would run the next call on the same
isolation key beside it. Every command carries its worker's id in its environment
(`OWNER_ENV`, inherited by everything it starts, even what leaves its process group), and a
worker starting up kills every process carrying its own id before it registers, so no call of
the new incarnation can overlap a leftover of the old one. Linux only (it reads /proc); where
there is no /proc, the worker says so and starts anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from workspaces.operations.command import OWNER_ENV
from workspaces.operations.prepared import PREPARED_ENV

log = logging.getLogger("sluice.worker")

PROC = Path("/proc")
# How long a starting worker waits for the killed processes to be gone.
WAIT_S = 5.0


def orphaned_pids(worker_id: str, *, name: str = OWNER_ENV) -> list[int]:
    """Processes other than this one whose environment says a worker `worker_id` started them:
    its commands (`OWNER_ENV`), or with `name=PREPARED_ENV` its prepared sandboxes."""
    marker = f"{name}={worker_id}".encode()
    me = os.getpid()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_orphans(worker_id: str, *, wait_s: float = WAIT_S) -> tuple[int, list[int]]:
    """SIGKILL every process a previous run of this worker left, with its process group, and
    wait until they are gone. Returns how many there were and those still alive."""
    if not PROC.is_dir():
        log.warning("no /proc here: commands an earlier run of this worker left are not looked for")
        return 0, []

    def left_running() -> list[int]:
        return orphaned_pids(worker_id) + orphaned_pids(worker_id, name=PREPARED_ENV)

    pids = left_running()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    # A dead process not reaped yet (a zombie) shows an empty environ: it no longer counts.
    left = left_running() if pids else []
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = left_running()
    if pids:
        log.warning(
            "killed processes an earlier run of this worker left running",
            extra={"worker_id": worker_id, "killed": len(pids), "still_alive": len(left)},
        )
    return len(pids), left
