"""Kills what a worker process's sandboxes left, once that process is gone.

bwrap's ``--die-with-parent`` misses one case (containers/bubblewrap#633): a worker killed
while a sandbox is still being set up takes the outer bwrap with it, and the inner one, not yet
set to die with its parent, waits forever for a set-up that never comes. Every bwrap a worker
process starts carries ``MARK_ENV`` with that process's token in its own environment (bwrap
unsets it for the command). The undertaker, a shell in a session of its own, waits for its
stdin, a pipe only the worker holds, to end, then SIGKILLs every process still so marked (a
sandbox's bwrap processes, and with its PID 1 everything inside it) until none is left.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading

from workspaces.sandbox import MARK_ENV

# Scans every 50 ms for at least 1 s, then until none is left (at most ~5 s in all): a bwrap
# forked just before the worker died shows its mark only once it has been executed, and one
# killed while it clones leaves a clone an earlier scan did not see. A killed process no
# longer shows its environment.
SCRIPT = (
    "read _; n=0; while [ $n -lt 100 ]; do n=$((n + 1)); "
    'found=$(grep -lzxF -- "$1" /proc/[0-9]*/environ 2>/dev/null); '
    '[ -n "$found" ] || [ $n -le 20 ] || exit 0; '
    'for f in $found; do p=${f#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null; done; '
    "sleep 0.05; done"
)


class Undertaker:
    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        # Its environment has no mark: it never finds itself.
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", SCRIPT, "undertaker", f"{MARK_ENV}={self.token}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            env={"PATH": os.defpath},
        )


_started: list[Undertaker] = []
_lock = threading.Lock()


def mark() -> dict[str, str]:
    """The environment entry every bwrap this process starts gets; the first call starts the
    undertaker, before any sandbox it must be able to find."""
    with _lock:
        if not _started:
            _started.append(Undertaker())
        return {MARK_ENV: _started[0].token}
