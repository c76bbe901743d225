"""search_text and list_files in processes of the worker's own, one per slot.

Both walk a whole tree in Python, and a worker's slots are threads of one process: under one
interpreter lock, concurrent walks of a shared workspace ran one at a time and slower than
that. Each walk here runs in a child process that does nothing else, so walks use the cores.
A walk still running past its call's deadline has its process killed and replaced, so it stops
instead of holding a slot's thread.

Children speak one JSON line each way per call: ``{"request", "root", "deadline"}`` in
(``deadline`` on ``time.monotonic()``, one clock for every process of the host), and one of
``{"ok": result}``, ``{"error": [code, message]}``, ``{"oserror": [errno, strerror]}`` or
``{"crash": traceback}`` out. A child ends when its stdin does (the worker stopped or died).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import time
import traceback
from typing import IO, Any

from workspaces.operations.command import OWNER_ENV
from workspaces.operations.errors import OperationError, past_deadline

# How long past the call's deadline a child may take to answer before it is killed: a walk
# checks the deadline between files, so only one huge or stuck file keeps it longer.
GRACE_S = 1.0
# The operations run here, each with the code it times out with.
WALKS = {"search_text": "SEARCH_TIMEOUT", "list_files": "LIST_TIMEOUT"}


class WalkFailed(RuntimeError):
    """A child's walk raised what run_operation does not map: the worker logs it."""


class TreeProcesses:
    """``count`` children, each running one walk (an operation of ``WALKS``) at a time."""

    def __init__(self, count: int) -> None:
        # None holds the place of a child ended after close(): whoever takes it is told the
        # worker stops.
        self._idle: queue.SimpleQueue[subprocess.Popen[bytes] | None] = queue.SimpleQueue()
        self._children: set[subprocess.Popen[bytes]] = set()
        self._closed = False
        for _ in range(count):
            self._idle.put(self._spawn())

    def run(self, request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
        """The walk's result for ``request``, or what it raises, from an idle child."""
        child: subprocess.Popen[bytes] | None = self._idle.get()
        if child is not None and child.poll() is not None:
            child = self._replace(child)
        if child is None:
            raise OperationError("READ_UNAVAILABLE", "The worker is stopping.")
        try:
            answer = self._ask(child, request, root=root, deadline=deadline)
        except BaseException:
            # A child that did not answer in time (or whose pipe broke) is in an unknown state.
            child = self._replace(child)
            raise
        finally:
            self._idle.put(child)
        if "ok" in answer:
            result: dict[str, object] = answer["ok"]
            return result
        if "error" in answer:
            raise OperationError(*answer["error"])
        if "oserror" in answer:
            raise OSError(*answer["oserror"])
        raise WalkFailed(answer.get("crash", "the walking process answered nothing known"))

    def close(self) -> None:
        """End every child (the worker is stopping)."""
        self._closed = True
        for child in list(self._children):
            self._end(child)

    def _ask(
        self,
        child: subprocess.Popen[bytes],
        request: dict[str, object],
        *,
        root: str,
        deadline: float,
    ) -> dict[str, Any]:
        assert child.stdin is not None and child.stdout is not None
        message = {"request": request, "root": root, "deadline": deadline}
        try:
            child.stdin.write(json.dumps(message).encode() + b"\n")
            child.stdin.flush()
        except OSError:
            raise OperationError(
                "READ_UNAVAILABLE", "The worker's walking process ended before the call."
            ) from None
        line = _read_line(child.stdout, deadline + GRACE_S)
        if line is None:
            raise past_deadline(WALKS[str(request["operation"])])
        if not line:
            raise OperationError(
                "READ_UNAVAILABLE", "The worker's walking process ended during the call."
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Not a command: without OWNER_ENV it is not counted among what commands started.
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        child = subprocess.Popen(
            [sys.executable, "-c", "from workspaces.operations.treeprocs import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._children.add(child)
        return child

    def _replace(self, child: subprocess.Popen[bytes]) -> subprocess.Popen[bytes] | None:
        self._end(child)
        return None if self._closed else self._spawn()

    def _end(self, child: subprocess.Popen[bytes]) -> None:
        self._children.discard(child)
        with contextlib.suppress(OSError):
            child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def _read_line(pipe: IO[bytes], until: float) -> bytes | None:
    """One line from ``pipe`` (b"" at its end), or None when ``until`` passed first."""
    chunks: list[bytes] = []
    fd = pipe.fileno()
    while True:
        wait_s = until - time.monotonic()
        if wait_s <= 0 or not select.select([fd], [], [], wait_s)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)


def serve() -> None:
    """A child's loop: one walk per line of stdin, until it ends."""
    # The operations' own table: the package imports this module first.
    from workspaces.operations import _HANDLERS

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    for line in stdin:
        message = json.loads(line)
        handler = _HANDLERS[message["request"]["operation"]]
        try:
            answer: dict[str, object] = {
                "ok": handler(
                    message["request"], root=message["root"], deadline=message["deadline"]
                )
            }
        except OperationError as exc:
            answer = {"error": [exc.code, exc.message]}
        except OSError as exc:
            answer = {"oserror": [exc.errno, exc.strerror]}
        except Exception:
            answer = {"crash": traceback.format_exc()}
        stdout.write(json.dumps(answer).encode() + b"\n")
        stdout.flush()
