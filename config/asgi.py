"""ASGI entry point: `uvicorn config.asgi:application`.

Lifespan here; every HTTP request goes to the API's edge (`api/execute/edge.py`).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application() does

# The edge's modules are Django's: they are imported once Django is set up.
from admission import shutdown  # noqa: E402
from api.execute.edge import Edge  # noqa: E402


class Application:
    """The ASGI lifespan (Django has none), then the edge for every request."""

    def __init__(self) -> None:
        self.edge = Edge()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.edge(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """Once the server runs, SIGTERM and SIGINT first wake this process's waiting calls
        (admission/shutdown.py); at shutdown the last answers' rows are written to Redis."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                shutdown.install(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.edge.emissions.flush()
                await send({"type": "lifespan.shutdown.complete"})
                return


application = Application()
