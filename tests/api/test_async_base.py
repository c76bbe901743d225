"""Tripwire for api/base.py: adrf hands async views to our `async_dispatch`, and the checks
(authentication, throttles) run on the event loop, not in Django's one sync thread.

If an adrf upgrade stops routing through `async_dispatch`, or our override falls back to
adrf's `sync_to_async(initial)`, the thread the authenticator sees changes and this fails.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django.test import AsyncRequestFactory
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle

from api.base import AsyncApiView

seen: dict[str, int] = {}


class _LoopAuthentication:
    async def authenticate(self, request: Request) -> tuple[Any, str] | None:
        seen["authenticate"] = threading.get_ident()
        if request.headers.get("Authorization") != "Bearer good":
            return None

        class User:
            is_authenticated = True

        return User(), "good"

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class _LoopThrottle(BaseThrottle):
    async def allow_request(self, request: Request, view: Any) -> bool:  # type: ignore[override]
        seen["throttle"] = threading.get_ident()
        return request.headers.get("X-Over") is None

    def wait(self) -> float:
        return 7.0


class _Probe(AsyncApiView):
    authentication_classes = [_LoopAuthentication]
    throttle_classes = [_LoopThrottle]

    async def get(self, request: Request) -> Response:
        seen["handler"] = threading.get_ident()
        return Response({"ok": True})


def _call(**headers: str) -> Response:
    async def run() -> Response:
        seen.clear()
        seen["loop"] = threading.get_ident()
        request = AsyncRequestFactory().get("/probe", headers=headers)
        response = await _Probe.as_view()(request)
        return response.render()

    return asyncio.run(run())


def test_authentication_throttles_and_handler_run_on_the_event_loop_thread() -> None:
    response = _call(Authorization="Bearer good")
    assert response.status_code == 200
    assert seen["authenticate"] == seen["throttle"] == seen["handler"] == seen["loop"]


def test_a_request_no_authenticator_claims_is_401_and_never_reaches_the_handler() -> None:
    response = _call()
    assert response.status_code == 401
    assert response.data["code"] == "UNAUTHENTICATED"
    assert "handler" not in seen


def test_an_async_throttle_refusal_is_a_typed_429_with_its_wait() -> None:
    response = _call(Authorization="Bearer good", **{"X-Over": "1"})
    assert response.status_code == 429
    assert response.data["code"] == "THROTTLED"
    assert response["Retry-After"] == "7"
