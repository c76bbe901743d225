"""A command's sandbox started before its command: bwrap with the call's exact mounts, and
inside it a shell that waits on its stdin for the command.

Starting bwrap (namespaces, a few dozen mounts) is most of what a sandboxed command costs
before it runs, so while one command runs the worker starts the sandbox the next command on
the same isolation key would get. The command, its working directory and its environment
reach the waiting shell only at hand-off, and the shell then becomes the command (``exec``):
the process the call waits for, its process group and its PID namespace are the same as for a
sandbox started at the call. The waiting shell starts with no environment but the worker's
id (``PREPARED_ENV``, removed at the hand-off), so no worker setting is there before it either.

A prepared sandbox serves at most one command: taking it removes it from the worker's table,
and only a call with the same worker sandbox, workspace, lane and network can take it. Before
it is used it must still be what a sandbox started now would be, else it is torn down and the
call starts a fresh one:

* the same bwrap arguments, rebuilt now: a lane or submodule added since changes the git
  metadata that must be read-only, and a directory that appeared or went changes the mounts;
* every bound path is still a mount point inside the sandbox and shows there the directory
  the host has at that path now: a bind holds the directory it found and follows it when the
  host renames it, so one renamed and replaced since would otherwise be written in the new
  one's place, or the new one be read-only. Bind mounts are live, so what was written into a
  bound directory since it was prepared is seen.

One that waits unused is torn down after ``IDLE_S``, when the worker exits, and (bwrap's
``--die-with-parent``) when the worker is killed; a restarted worker also finds any left by
``PREPARED_ENV`` (workspaces/runtime/orphans.py).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import queue
import re
import select
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from workspaces.operations.undertaker import mark
from workspaces.sandbox import Sandbox, release_git_placeholders, take_git_placeholders

# The waiting shell: one byte says the sandbox is set up, then it runs what arrives on stdin.
# Input that ends before the command is handed over ends it.
STUB = "printf .; . /dev/stdin; exit 125"
# The one variable a waiting shell has: the id of the worker that prepared it. Not the
# commands' OWNER_ENV, so that "what a command started" stays a question of that one.
PREPARED_ENV = "SLUICE_PREPARED_BY"
IDLE_S = 30.0
# Sandboxes kept prepared per isolation key. Starting one is mostly waiting (the kernel's
# namespace and mount set-up), not CPU, so a second one started a command earlier is
# usually ready for back-to-back commands even when one start outlasts a command.
AHEAD = 2
# The most sandboxes one worker keeps prepared in all; past it the oldest goes.
MAX_PREPARED = 8
# How long a hand-off waits for a prepared sandbox still being set up.
READY_WAIT_S = 10.0
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINDS = frozenset({"--bind", "--ro-bind"})


@dataclass(frozen=True)
class SandboxKey:
    """What a prepared sandbox was started for; a call with any other key never gets it."""

    sandbox: Sandbox
    workspace_root: str
    worktree: str | None
    network: bool


class PreparedSandbox:
    """One bwrap whose shell waits for one command."""

    def __init__(self, key: SandboxKey, *, root: str, env: dict[str, str]) -> None:
        self.key = key
        self.used = False
        # Taken before the arguments are built: they bind the placeholders read-only.
        self._placeholders = take_git_placeholders(key.workspace_root, key.worktree)
        info_read, info_write = os.pipe()
        try:
            self.argv = argv = key.sandbox.argv(
                STUB,
                workspace_root=key.workspace_root,
                worktree=key.worktree,
                cwd=root,
                network=key.network,
            )
            self.proc = subprocess.Popen(
                [argv[0], "--info-fd", str(info_write), *argv[1:]],
                cwd=root,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                close_fds=True,
                pass_fds=(info_write,),
                env=env | mark(),
            )
        except BaseException:
            os.close(info_read)
            release_git_placeholders(self._placeholders)
            raise
        finally:
            os.close(info_write)
        self._info = info_read
        self._timer = threading.Timer(IDLE_S, _expire, (self,))
        self._timer.daemon = True
        self._timer.start()

    def hand_over(
        self, command: str, *, cwd: str, env: dict[str, str], wait_s: float = READY_WAIT_S
    ) -> bool:
        """Start ``command`` in this sandbox; False (and the sandbox torn down) when it is no
        longer what a fresh one would be, or did not come up within ``wait_s``."""
        if self.used:
            raise RuntimeError("a prepared sandbox runs one command only")
        self.used = True
        self._timer.cancel()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], min(wait_s, READY_WAIT_S))
            if not ready or os.read(self.proc.stdout.fileno(), 1) != b".":
                raise OSError("the prepared sandbox did not come up")
            if not self._mounts_current():
                raise OSError("the prepared sandbox no longer mounts what it would now")
            self.proc.stdin.write(_payload(command, cwd=cwd, env=env))
            self.proc.stdin.close()
        except (OSError, ValueError):
            self.discard()
            return False
        return True

    def is_up(self) -> bool:
        """Whether the shell has said it waits (or bwrap failed: the pipe then reads as ended)."""
        assert self.proc.stdout is not None
        if self.used or self.proc.poll() is not None:
            return False
        return bool(select.select([self.proc.stdout], [], [], 0)[0])

    def _mounts_current(self) -> bool:
        expected = self.key.sandbox.argv(
            STUB,
            workspace_root=self.key.workspace_root,
            worktree=self.key.worktree,
            cwd=_chdir_of(self.argv),
            network=self.key.network,
        )
        if expected != self.argv:
            return False
        child = int(json.loads(_read_available(self._info) or b"{}").get("child-pid", 0))
        if not child:
            return False
        inside = f"/proc/{child}/root"
        try:
            mount_points = _mount_points(f"/proc/{child}/mountinfo")
            for path in _bound_paths(self.argv):
                # A mount follows its directory when the host renames it: it must still be
                # at its path, and show there what the host has there now.
                host, seen = os.stat(path), os.stat(inside + path)
                if path not in mount_points or (host.st_dev, host.st_ino) != (
                    seen.st_dev,
                    seen.st_ino,
                ):
                    return False
        except OSError:
            return False
        return True

    def discard(self) -> None:
        """Tear the sandbox down: its shell and everything in its PID namespace end."""
        self.used = True
        self._timer.cancel()
        _forget(self)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.release()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def release(self) -> None:
        """Give back what the sandbox held besides its processes (once its command is over)."""
        if self._info >= 0:
            os.close(self._info)
            self._info = -1
        taken, self._placeholders = self._placeholders, []
        release_git_placeholders(taken)


_prepared: dict[SandboxKey, list[PreparedSandbox]] = {}
_pending: collections.Counter[SandboxKey] = collections.Counter()
_lock = threading.Lock()
# Notified whenever a request of the preparing thread is done.
_done = threading.Condition(_lock)
# Bumped by discard_all: a request made before it is dropped, not started.
_generation = 0
_requests: queue.SimpleQueue[tuple[int, SandboxKey, str, dict[str, str]]] = queue.SimpleQueue()
_preparer: threading.Thread | None = None


def take(key: SandboxKey) -> PreparedSandbox | None:
    """The oldest sandbox prepared for exactly ``key``, now no longer anyone else's, or None."""
    with _lock:
        ready = _prepared.get(key)
        prepared = ready.pop(0) if ready else None
        if ready is not None and not ready:
            del _prepared[key]
    if prepared is not None and prepared.proc.poll() is not None:
        prepared.discard()
        return None
    return prepared


def prepare(key: SandboxKey, *, root: str, env: dict[str, str]) -> None:
    """Have ``AHEAD`` sandboxes for the next commands on ``key`` prepared or on their way.
    ``root`` is the call's tree (the lane for a lane call): the shell waits there, with
    ``env`` (the worker's id alone) until its command brings its own.

    Sandboxes are started on the worker's one preparing thread, so the call asking for them
    does not wait for bwrap's start: that thread lives as long as the worker, and it must,
    because bwrap's ``--die-with-parent`` ends a sandbox when the thread that started it ends.
    """
    global _preparer
    with _lock:
        wanted = AHEAD - len(_prepared.get(key, ())) - _pending[key]
        if wanted <= 0:
            return
        _pending[key] += wanted
        if _preparer is None:
            atexit.register(discard_all)
            _preparer = threading.Thread(target=_prepare_loop, name="sandbox-preparer", daemon=True)
            _preparer.start()
        generation = _generation
    for _ in range(wanted):
        _requests.put((generation, key, root, env))


def waiting_for(key: SandboxKey) -> int:
    """How many sandboxes for ``key``'s next commands are up, their shell waiting."""
    with _lock:
        ready = list(_prepared.get(key, ()))
    return sum(1 for prepared in ready if prepared.is_up())


def prepared_count() -> int:
    with _lock:
        return sum(len(ready) for ready in _prepared.values())


def discard_all(wait_s: float = 10.0) -> None:
    """Tear down every prepared sandbox, and those on their way (the worker is stopping)."""
    global _generation
    with _lock:
        _generation += 1
        everything = [p for ready in _prepared.values() for p in ready]
        _prepared.clear()
        # A sandbox being started right now is torn down by the preparing thread itself.
        _done.wait_for(lambda: not _pending, wait_s)
    for prepared in everything:
        prepared.discard()


def _prepare_loop() -> None:
    while True:
        generation, key, root, env = _requests.get()
        try:
            _start(generation, key, root, env)
        finally:
            with _lock:
                _pending[key] -= 1
                if _pending[key] <= 0:
                    del _pending[key]
                _done.notify_all()


def _start(generation: int, key: SandboxKey, root: str, env: dict[str, str]) -> None:
    with _lock:
        if generation != _generation:
            return
    try:
        prepared = PreparedSandbox(key, root=root, env=env)
    except OSError:
        return
    evicted: list[PreparedSandbox] = []
    with _lock:
        if generation != _generation:
            evicted.append(prepared)
        else:
            _prepared.setdefault(key, []).append(prepared)
        while sum(len(ready) for ready in _prepared.values()) > MAX_PREPARED:
            # The key that waited longest gives up its oldest sandbox.
            oldest = next(iter(_prepared))
            evicted.append(_prepared[oldest].pop(0))
            if not _prepared[oldest]:
                del _prepared[oldest]
    for extra in evicted:
        extra.discard()


def _expire(prepared: PreparedSandbox) -> None:
    if _forget(prepared):
        prepared.discard()


def _forget(prepared: PreparedSandbox) -> bool:
    """Take ``prepared`` out of the table; False when it was not there (taken already)."""
    with _lock:
        ready = _prepared.get(prepared.key, [])
        if prepared not in ready:
            return False
        ready.remove(prepared)
        if not ready:
            del _prepared[prepared.key]
        return True


def _payload(command: str, *, cwd: str, env: dict[str, str]) -> bytes:
    """What the waiting shell runs: the call's directory and environment, then the command
    as ``/bin/sh -c`` with stdin from /dev/null, as a sandbox started for it would run it.
    Every value is single-quoted; a variable whose name a shell cannot export is left out."""
    lines = [f"cd -- {shlex.quote(cwd)} || exit 125", f"unset OLDPWD {PREPARED_ENV}"]
    lines += [f"export {n}={shlex.quote(v)}" for n, v in env.items() if _NAME.match(n)]
    lines += ["export TMPDIR=/tmp", f"exec /bin/sh -c {shlex.quote(command)} <>/dev/null", ""]
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def _chdir_of(argv: list[str]) -> str:
    return argv[argv.index("--chdir") + 1]


def _bound_paths(argv: list[str]) -> list[str]:
    """The destinations of every bind in a bwrap argv (each is bound over itself)."""
    end = argv.index("--")
    return [argv[i + 2] for i in range(1, end - 2) if argv[i] in _BINDS]


def _mount_points(mountinfo: str) -> set[str]:
    """Where each mount of a mount namespace is (mountinfo's fifth field, octal escapes undone)."""
    with open(mountinfo, "rb") as f:
        lines = f.read().splitlines()
    return {
        re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split()[4]).decode(
            "utf-8", "surrogateescape"
        )
        for line in lines
    }


def _read_available(fd: int) -> bytes:
    """What bwrap wrote to its info pipe; it writes it before the sandbox's shell starts."""
    chunks = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.rstrip().endswith(b"}"):
            break
    return b"".join(chunks)
