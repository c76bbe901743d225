"""ASGI entry point: `uvicorn config.asgi:application`."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from typing import Any

import django
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

ASGIScope = dict[str, Any]


class SluiceAsgiHandler(ASGIHandler):
    """Django's ASGI handler, with a shorter way through it for the workspace API.

    For every request Django starts a thread of its own and hops into it twice (the
    request_started and request_finished signals: resetting the query log, closing the DB
    connections of that thread). The workspace API's async view never touches the database on
    such a thread (its reads run in a pool, `admission.dbthread`, which looks after its own
    connections), so on this 2-core machine those hops were a quarter of a call's overhead.
    API requests skip them; everything else (admin, dashboard, worker endpoints) is untouched.
    They keep the rest: the middleware chain, the view's cancellation when the client goes
    away, and the response's close.
    """

    async def __call__(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        from config.middleware import FAST_PREFIX

        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope.get("path", "").startswith(FAST_PREFIX):
            await self._handle_api(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """ASGI lifespan (Django itself has none): once the server runs, SIGTERM and SIGINT
        first wake this process's waiting calls (admission/shutdown.py)."""
        from admission import shutdown

        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                shutdown.install(asyncio.get_running_loop())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                from api.workspace_tools import emissions_flush

                # The last answers' completion rows are still on their way to Redis (the
                # drainer process lands them in Postgres).
                await emissions_flush()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _handle_api(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            # Gone before its body was read; a POST to execute still leaves its row.
            from api.workspace_tools import execute_abandoned

            request, _ = self.create_request(scope, io.BytesIO())
            if request is not None:
                execute_abandoned(request)
            return
        with body_file:
            set_script_prefix(get_script_prefix(scope))
            request, refusal = self.create_request(scope, body_file)
            if request is None:
                assert refusal is not None
                await self.send_response(refusal, send)
                refusal.close()
                return
            view = asyncio.create_task(self.run_get_response(request))
            gone = asyncio.create_task(self.listen_for_disconnect(receive))
            await asyncio.wait([view, gone], return_when=asyncio.FIRST_COMPLETED)
            if not view.done():
                # The client went away: the view is cancelled (and takes its queue place along).
                gone.exception()  # RequestAborted, the expected end of that task: retrieved
                view.cancel()
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await view
                return
            gone.cancel()
            response = view.result()
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.send_response(response, send)
            finally:
                # request_finished runs here, on the event loop's thread, which holds no
                # database connection (nothing on it may touch the database).
                response.close()


django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application() does
application = SluiceAsgiHandler()
