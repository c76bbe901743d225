"""The image's default command: apply migrations, then serve the API as `make run` does.

`API_PROCESSES` uvicorn processes (2) on `$PORT` (8000) of `HOST` (every address), with make
run's server options (scripts/devprocs.py `api_serve_args`). uvicorn replaces this process, so
the container's stop signal reaches it directly. `GRACEFUL_SHUTDOWN_S` bounds how long a
stopping process waits for calls already dispatched to a worker (docs/deploy.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

from scripts.devprocs import api_serve_args


def serve_command(env: dict[str, str]) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "config.asgi:application",
        "--host", env.get("HOST") or "0.0.0.0",
        "--port", env.get("PORT") or "8000",
        "--timeout-graceful-shutdown", env.get("GRACEFUL_SHUTDOWN_S") or "30",
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
