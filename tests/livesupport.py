"""Real processes for end-to-end tests: uvicorn API servers, their completion drainers and
`runworker` workers.

Nothing here stands in for a part of Sluice: the API is the ASGI app under uvicorn, the
worker is `manage.py runworker` consuming its Celery queue from the real Redis.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.backoff import NoBackoff
from redis.retry import Retry

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# Whether the running test is marked e2e (tests/conftest.py sets it before each test's setup;
# None outside pytest: benchmarks, the fuzzer and the soak use these processes too). The unit
# tier (`-m "not e2e"`) is everything that starts none of LIVE_COMMANDS: a test that does and
# is not marked fails at once, naming the marker it lacks.
current_test_e2e: bool | None = None
# The API processes a test starts take this scrape token; workers never get it.
METRICS_TOKEN = "test-scrape-" + uuid.uuid4().hex
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}

LIVE_COMMANDS = frozenset({"uvicorn", "runworker", "drain_completions", "scripts.dev"})


class Process:
    """A child process whose output is collected line by line (and can be waited on)."""

    def __init__(
        self, args: list[str], env: dict[str, str], name: str, *, cwd: Path = ROOT
    ) -> None:
        live = LIVE_COMMANDS.intersection(args)
        if live and current_test_e2e is False:
            raise AssertionError(
                f"this test starts {', '.join(sorted(live))} but is not marked e2e "
                "(add pytest.mark.e2e: the unit tier starts no uvicorn and no runworker)"
            )
        self.args, self.env, self.name = args, env, name
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)

    def wait_for(self, text: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        for line in list(self.lines):
            if text in line:
                return line
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self._new.empty():
                    break
                continue
            if text in line:
                return line
        raise AssertionError(
            f"{self.name} never printed {text!r}; output:\n" + "\n".join(self.lines[-40:])
        )

    def output(self) -> str:
        return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the process and everything it started (commands run in their own groups too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_group()
            return -9


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    # Children of a test are local runs: they use this checkout's generated secret key.
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SLUICE_LOCAL_SECRET": "1",
            # As in the test session itself (conftest): no ACL users on the shared Redis.
            "SLUICE_WORKER_REDIS_ACL": "off",
        }
    )
    env.update(extra or {})
    return env


@dataclass
class ApiServer:
    url: str
    process: Process
    # Started with `start_api(processes=N)`: N processes share its port.
    processes: int | None = None

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=httpx.Timeout(400.0, connect=5.0), **kwargs)

    def pids(self) -> list[int]:
        """The processes that serve its requests: uvicorn's own, or (`processes`) the ones
        it started, not its multiprocessing helpers; those that have started so far."""
        own = self.process.proc.pid
        if self.processes is None:
            return [own]
        try:
            children = Path(f"/proc/{own}/task/{own}/children").read_text().split()
        except OSError:
            return []
        return [
            int(pid)
            for pid in children
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]


# One completion drainer (`manage.py drain_completions`) per database and Redis namespace that
# an API of this session writes to, as a deployment runs one beside its API processes. They
# live for the session: an API killed by a test leaves its rows to them, as in production.
_drainers: dict[tuple[str, str, str], Process] = {}


def ensure_drainer(env: dict[str, str]) -> Process:
    key = (
        env.get("DATABASE_URL", ""),
        env.get("ADMISSION_REDIS_URL") or env.get("REDIS_URL", ""),
        env.get("SLUICE_REDIS_PREFIX", ""),
    )
    drainer = _drainers.get(key)
    if drainer is None or not drainer.alive():
        drainer = Process([PYTHON, "manage.py", "drain_completions"], env, "drainer")
        drainer.wait_for("completion drainer")
        _drainers[key] = drainer
    return drainer


@atexit.register
def stop_drainers() -> None:
    for drainer in _drainers.values():
        drainer.stop(timeout_s=5)
    _drainers.clear()


def start_api(
    env: dict[str, str], *, drainer: bool = True, processes: int | None = None
) -> ApiServer:
    """A uvicorn API process, and (unless `drainer=False`) the drainer its rows need. With
    `processes`: served as `make run` serves it, that many processes on one port."""
    if drainer:
        ensure_drainer(env)
    port = free_port()
    serving = []
    if processes is not None:
        # Imported here: with benchmarks/ first on sys.path, `scripts` is benchmarks/scripts.py.
        from scripts.devprocs import api_serve_args

        serving = api_serve_args(processes)
    proc = Process(
        [
            PYTHON,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--timeout-graceful-shutdown",
            "2",
            *serving,
        ],
        env | {"METRICS_TOKEN": METRICS_TOKEN},
        f"api:{port}",
    )
    server = ApiServer(f"http://127.0.0.1:{port}", proc, processes)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            answered = httpx.get(f"{server.url}/healthz", timeout=1).status_code in (200, 503)
        except httpx.TransportError:
            answered = False
        # Several processes: each of them has started (one answering is not all of them).
        if answered and len(server.pids()) >= (processes or 1):
            return server
        if not proc.alive():
            break
        time.sleep(0.1)
    raise AssertionError("API server did not start:\n" + proc.output())


@dataclass
class Worker:
    worker_id: str
    token: str
    workspaces: dict[str, Path]
    api_url: str
    env: dict[str, str]
    slots: int | None = None
    lanes: bool = False
    # More runworker flags, e.g. ["--workspace-no-network", "a"].
    extra_args: list[str] = field(default_factory=list)
    # Commands run sandboxed, so a test that reads what they leave (markers, logs) names where:
    # by default the directories holding its workspaces (a test's tmp_path), shared with every
    # command of this worker (runworker --command-shared-dir). [] shares nothing.
    shared_dirs: list[Path] | None = None
    process: Process | None = None
    incarnations: list[str] = field(default_factory=list)

    def args(self) -> list[str]:
        args = [
            PYTHON,
            "manage.py",
            "runworker",
            "--worker-id",
            self.worker_id,
            "--token",
            self.token,
            "--api",
            self.api_url,
        ]
        for ws_id, path in self.workspaces.items():
            args += ["--workspace", f"{ws_id}={path}"]
        if self.slots is not None:
            args += ["--slots", str(self.slots)]
        if self.lanes:
            args.append("--linked-worktree-lanes")
        shared = self.shared_dirs
        if shared is None:
            shared = sorted({Path(p).parent for p in self.workspaces.values()})
        for directory in shared:
            args += ["--command-shared-dir", str(directory)]
        return args + self.extra_args

    def start(self) -> Worker:
        self.process = Process(self.args(), self.env, f"worker:{self.worker_id}")
        line = self.process.wait_for("registered: incarnation", timeout_s=60)
        self.incarnations.append(line.split("incarnation ", 1)[1].split(",", 1)[0])
        # Celery's consumer starts right after registration; wait until it listens.
        self.process.wait_for("ready", timeout_s=60)
        return self

    @property
    def incarnation(self) -> str:
        return self.incarnations[-1]

    def stop(self) -> None:
        if self.process is not None and self.process.alive():
            self.process.stop()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill_group()


def run_command(*args: str) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` through manage.py's own entry (execute_from_command_line) in this
    process, on the test database: the same parsing, output and exit status as the command
    run by hand, without a new interpreter (on this machine one takes 5-12 s to start Django).
    A command whose point is how a fresh process reads its environment still runs as one."""
    import io

    from django.core.management import execute_from_command_line

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            execute_from_command_line(["manage.py", *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["manage.py", *args], code, out.getvalue(), err.getvalue())


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def git_workspace(
    path: Path, *, files: dict[str, str] | None = None, lanes: tuple[str, ...] = ()
) -> Path:
    """A real git checkout with committed files and, optionally, linked worktrees under .worktrees/."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "# demo\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    for lane in lanes:
        git(path, "worktree", "add", "-q", f".worktrees/{lane}", "-b", lane)
    return path


# For a client that asks whether a Redis answers yet: redis-py's default retries a refused
# connection for about 3.5 s before it says no.
NO_RETRY = Retry(NoBackoff(), 0)


def wait_until(
    predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.02
) -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def pid_alive(pid: int) -> bool:
    """Whether a process still runs; a zombie (killed, not yet reaped by its new parent) is dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def asgi_scope(
    headers: list[tuple[bytes, bytes]],
    *,
    path: str = "/v1/workspace-tools/execute",
    method: str = "POST",
) -> dict[str, Any]:
    """An HTTP request's ASGI scope as uvicorn hands it over, for calling the application in
    this process (tests and benchmarks of the edge, config/asgi.py)."""
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 40000),
        "asgi": {"version": "3.0"},
        "headers": headers,
    }
