"""execute_command: ``/bin/sh -c`` in its own process group, bounded in time and output.

The command is the leader of a new session, so its process group holds everything it spawns
that did not deliberately leave (``setsid``). Whatever happens, the group gets SIGKILL before
we return: a background job must not outlive the call and keep writing to the workspace
after the next call (perhaps another agent's) has started there.

With a ``Confinement`` (the worker's normal case) the shell runs inside bubblewrap
(workspaces/sandbox.py): the process we start and wait for is bwrap, whose exit ends the
command's whole PID namespace, so even what left the group with ``setsid`` ends with the call.
While a sandboxed command runs, the sandbox the next command on its isolation key would get is
started and left waiting for that command (workspaces/operations/prepared.py).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from workspaces.operations import prepared, undertaker
from workspaces.operations.errors import OperationError, OutcomeUnknown
from workspaces.operations.paths import resolve_dir
from workspaces.sandbox import Sandbox, hold_git_placeholders

# After the leader exits, grandchildren may still hold stdout/stderr open (``cmd &``). We read
# for this long more, then kill the group, so a forgotten background job costs 100 ms rather
# than the whole timeout.
GRACE_AFTER_EXIT_S = 0.1
# After the kill, output already in the pipes is still collected for at most this long.
DRAIN_AFTER_KILL_S = 0.1
# Without a pidfd (Linux < 5.3) the leader's exit is noticed by polling at this interval.
EXIT_POLL_S = 0.05
_READ_CHUNK = 64 * 1024

# Every command's environment names the worker that started it, so that a restarted worker
# can find what its killed predecessor left running (workspaces/runtime/orphans.py).
OWNER_ENV = "SLUICE_COMMAND_OF"
# The worker's own configuration never reaches a command: the worker token and the Redis and
# Postgres URLs (with their passwords) would let the command act as the worker.
_WORKER_ONLY_PREFIXES = ("SLUICE_", "DJANGO_", "CELERY_")
_WORKER_ONLY_NAMES = frozenset(
    {
        "DATABASE_URL",
        "REDIS_URL",
        "ADMISSION_REDIS_URL",
        "ADMISSION_REDIS_CLUSTER",
        "SECRET_KEY",
        "ISOLATION_KEY_SECRET",
        "METRICS_TOKEN",
    }
)


@dataclass(frozen=True)
class Confinement:
    """One workspace's share of the worker's sandbox, handed to each of its command calls."""

    sandbox: Sandbox
    workspace_root: str  # realpath of the checkout, also for a lane call
    network: bool = True
    # Run in a sandbox prepared while the previous command ran, and prepare the next one (off:
    # every command starts its own sandbox).
    prepared: bool = True


def command_env() -> dict[str, str]:
    """The worker's environment without its own configuration, plus OWNER_ENV when the
    worker has set it (`runworker` does, before it takes any call)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _WORKER_ONLY_NAMES and not name.startswith(_WORKER_ONLY_PREFIXES)
    }
    owner = os.environ.get(OWNER_ENV)
    if owner:
        env[OWNER_ENV] = owner
    return env


def _leader_exited(pid: int) -> bool:
    # WNOWAIT leaves the leader a zombie: its pid, and so its process group id, stays reserved
    # until we reap it after the group kill, so the kill can never hit a recycled group.
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Stream:
    def __init__(self) -> None:
        self.data = bytearray()
        self.cut = False

    def text(self) -> str:
        if not self.cut:
            return self.data.decode("utf-8", errors="replace")
        # A cut can split a multi-byte character; the incremental decoder drops that partial
        # tail instead of turning it into U+FFFD.
        return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(
            bytes(self.data), final=False
        )


class _Capture:
    """Reads stdout and stderr together, keeping their first ``cap`` bytes between them (one
    budget for both, as LibreChat's client checks it).

    Reading goes on past the cap (the excess is dropped) so the child never blocks on a full
    pipe and its exit is not delayed by our limit.
    """

    def __init__(self, proc: subprocess.Popen[bytes], cap: int) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.cap = cap
        self.out = _Stream()
        self.err = _Stream()
        self.selector = selectors.DefaultSelector()
        self.selector.register(proc.stdout.fileno(), selectors.EVENT_READ, self.out)
        self.selector.register(proc.stderr.fileno(), selectors.EVENT_READ, self.err)
        self.pipes_open = 2
        self.pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.pidfd = os.pidfd_open(proc.pid)
            # Readable once the leader exits: wakes the loop without polling.
            self.selector.register(self.pidfd, selectors.EVENT_READ, None)

    def forget_pidfd(self) -> None:
        # An exited process's pidfd stays readable; left registered it would spin the loop.
        if self.pidfd is not None:
            self.selector.unregister(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None

    def wait(self, timeout_s: float) -> None:
        if not self.selector.get_map():
            time.sleep(max(0.0, timeout_s))
            return
        for key, _ in self.selector.select(max(0.0, timeout_s)):
            if key.data is None:
                continue
            chunk = os.read(key.fd, _READ_CHUNK)
            if not chunk:
                self.selector.unregister(key.fd)
                self.pipes_open -= 1
                continue
            stream: _Stream = key.data
            room = self.cap - len(self.out.data) - len(self.err.data)
            if len(chunk) > room:
                stream.cut = True
            if room > 0:
                stream.data += chunk[:room]

    def close(self) -> None:
        self.forget_pidfd()
        self.selector.close()


def _run(proc: subprocess.Popen[bytes], capture: _Capture, end: float) -> bool:
    """Pump output until the command is done; True when it ran out of time."""
    exited_at: float | None = None
    while True:
        now = time.monotonic()
        if exited_at is None and _leader_exited(proc.pid):
            exited_at = now
            capture.forget_pidfd()
        if exited_at is not None:
            if capture.pipes_open == 0 or now >= exited_at + GRACE_AFTER_EXIT_S:
                return False
            capture.wait(exited_at + GRACE_AFTER_EXIT_S - now)
            continue
        if now >= end:
            return True
        wait_s = end - now if capture.pidfd is not None else min(end - now, EXIT_POLL_S)
        capture.wait(wait_s)


def _fit(text: str, max_bytes: int) -> tuple[str, bool]:
    """`text` cut to at most `max_bytes` of UTF-8 (never half a character); True if cut."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    return data[: max(max_bytes, 0)].decode("utf-8", errors="ignore"), True


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def execute_command(
    request: dict[str, object],
    *,
    root: str,
    deadline: float,
    confinement: Confinement | None = None,
) -> dict[str, object]:
    command = str(request["command"])
    cwd = resolve_dir(root, str(request.get("cwd") or ""))
    budget_s = min(int(str(request["timeoutMs"])) / 1000, deadline - time.monotonic())
    cap = int(str(request["maxOutputBytes"]))
    if budget_s <= 0:
        raise OperationError(
            "COMMAND_UNAVAILABLE", "No time was left before the deadline to start the command."
        )
    if confinement is None:
        return _collect(
            _start(["/bin/sh", "-c", command], cwd=cwd, env=command_env()),
            budget_s=budget_s,
            cap=cap,
        )
    worktree = str(request.get("worktree") or "") or None
    key = prepared.SandboxKey(
        confinement.sandbox, confinement.workspace_root, worktree, confinement.network
    )
    # The git metadata's placeholders stay until the sandbox, and all it ran, has ended.
    with hold_git_placeholders(confinement.workspace_root, worktree):
        ready = prepared.take(key) if confinement.prepared else None
        wait_s = min(budget_s, deadline - time.monotonic())
        if ready is not None and ready.hand_over(
            command, cwd=cwd, env=command_env(), wait_s=wait_s
        ):
            proc = ready.proc
            # Waiting for a sandbox still coming up spends the call's time, not the command's.
            budget_s = min(budget_s, deadline - time.monotonic())
        else:
            ready = None
            argv = confinement.sandbox.argv(
                command,
                workspace_root=confinement.workspace_root,
                worktree=worktree,
                cwd=cwd,
                network=confinement.network,
            )
            proc = _start(argv, cwd=cwd, env=command_env() | undertaker.mark())

        def prepare_next() -> None:
            owner = os.environ.get(OWNER_ENV)
            env = {prepared.PREPARED_ENV: owner} if owner else {}
            prepared.prepare(key, root=root, env=env)

        try:
            meanwhile = prepare_next if confinement.prepared else None
            return _collect(proc, budget_s=budget_s, cap=cap, meanwhile=meanwhile)
        finally:
            if ready is not None:
                ready.release()


def _start(argv: list[str], *, cwd: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    except OSError as exc:
        raise OperationError(
            "COMMAND_UNAVAILABLE", f"The command could not be started: {exc.strerror}."
        ) from None


def _collect(
    proc: subprocess.Popen[bytes],
    *,
    budget_s: float,
    cap: int,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, object]:
    """Wait for a started command within ``budget_s``, then kill what is left of it.
    ``meanwhile`` runs once the command is running (and is killed whatever it raises)."""
    capture: _Capture | None = None
    try:
        # Everything after Popen is inside this try: the command is running, so whatever goes
        # wrong, the finally below must still kill its group and reap it.
        capture = _Capture(proc, cap)
        if meanwhile is not None:
            meanwhile()
        timed_out = _run(proc, capture, time.monotonic() + budget_s)
        _kill_group(proc.pid)
        drain_end = time.monotonic() + DRAIN_AFTER_KILL_S
        while capture.pipes_open and time.monotonic() < drain_end:
            capture.wait(drain_end - time.monotonic())
    except OSError:
        raise OutcomeUnknown(
            "COMMAND_UNAVAILABLE", "The command started but its outcome could not be collected."
        ) from None
    finally:
        # Kill before reaping: the leader's zombie keeps the group id from being reused.
        _kill_group(proc.pid)
        proc.wait()
        if capture is not None:
            capture.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    # Decoding turns an invalid byte into U+FFFD (3 bytes): the texts are fitted to the cap
    # again, stdout first, so what is sent stays within it.
    stdout, out_cut = _fit(capture.out.text(), cap)
    stderr, err_cut = _fit(capture.err.text(), cap - len(stdout.encode()))
    result: dict[str, object] = {
        "exitCode": None,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": capture.out.cut or capture.err.cut or out_cut or err_cut,
        "timedOut": timed_out,
    }
    if timed_out:
        result["signal"] = "SIGKILL"
    elif proc.returncode < 0:
        result["signal"] = _signal_name(-proc.returncode)
    else:
        result["exitCode"] = proc.returncode
    return result
