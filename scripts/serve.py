"""The image's default command: apply migrations, then serve the API as `make run` does.

`API_PROCESSES` uvicorn processes (2) on `$PORT` (8000) of `HOST` (every address), with make
run's server options (scripts/devprocs.py `api_serve_args`). uvicorn replaces this process, so
the container's stop signal reaches it directly. A stopping process waits for the calls
already dispatched to a worker for up to `GRACEFUL_SHUTDOWN_S`, by default the longest a
command may run (`JOB_TIMEOUT`), as docs/deploy.md asks.
"""

from __future__ import annotations

import os
import subprocess
import sys

from scripts.devprocs import api_serve_args


def graceful_shutdown_s(env: dict[str, str]) -> str:
    if env.get("GRACEFUL_SHUTDOWN_S"):
        return env["GRACEFUL_SHUTDOWN_S"]
    job_timeout_ms = int(env.get("JOB_TIMEOUT") or 300_000)
    return str(-(-job_timeout_ms // 1000))


def serve_command(env: dict[str, str]) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "config.asgi:application",
        "--host", env.get("HOST") or "0.0.0.0",
        "--port", env.get("PORT") or "8000",
        "--timeout-graceful-shutdown", graceful_shutdown_s(env),
        "--no-access-log",
        *api_serve_args(int(env.get("API_PROCESSES") or "2")),
    ]  # fmt: skip


def main() -> None:
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], check=False)
    if migrate.returncode:
        sys.exit(migrate.returncode)
    command = serve_command(dict(os.environ))
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
