"""Static files through the real ASGI handler leave the terminal quiet.

In a process of its own: pytest restores the warning filters that settings install, so only a
fresh interpreter shows what the `make run` terminal shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SERVE_ONE_STATIC_FILE = """
import asyncio, django
django.setup()
from django.core.handlers.asgi import ASGIHandler

sent = []
messages = iter([{"type": "http.request", "body": b"", "more_body": False}])

async def receive():
    # After its request, a client that stays connected sends nothing more.
    return next(messages, None) or await asyncio.Event().wait()

async def send(message):
    sent.append(message)

scope = {"type": "http", "method": "GET", "path": "/static/dashboard/dashboard.css",
         "query_string": b"", "headers": [(b"host", b"localhost")],
         "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
asyncio.run(ASGIHandler()(scope, receive, send))
assert sent[0]["status"] == 200, sent[0]
assert b"".join(m.get("body", b"") for m in sent[1:])
"""


def test_a_static_file_is_served_without_a_warning() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", SERVE_ONE_STATIC_FILE],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "StreamingHttpResponse" not in done.stderr, done.stderr
