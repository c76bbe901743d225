"""The base of the API's async views: adrf's APIView with its checks awaited on the event loop.

adrf runs DRF's `initial()` (authentication, permissions, throttles) through `sync_to_async`,
that is in Django's one thread-sensitive thread, and from there hops back to the loop for any
async authenticator or throttle. Every call would then queue behind every other call's checks
on that single thread: under a burst, the burst's own authentication would stall everyone's.
`async_dispatch` below does what adrf's does, step for step, but awaits the checks where they
are: an async authenticator's query runs in the database pool (`admission.dbthread`), an async
throttle's Redis script on the loop. It uses DRF's documented hooks only (initialize_request,
perform_content_negotiation, determine_version, check_permissions, handle_exception,
finalize_response); tests/api/test_async_base.py pins the adrf behaviour it relies on.
"""

from __future__ import annotations

from typing import Any

from adrf.views import APIView
from django.http import HttpRequest, HttpResponseBase
from rest_framework import exceptions
from rest_framework.request import Request


class AsyncApiView(APIView):
    async def async_dispatch(
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        self.args, self.kwargs = args, kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            await self.prepare(drf_request)
            await self.ainitial(drf_request)
            method = (drf_request.method or "").lower()
            handler: Any = (
                getattr(self, method, self.http_method_not_allowed)
                if method in self.http_method_names
                else self.http_method_not_allowed
            )
            response = handler(drf_request, *args, **kwargs)
            if hasattr(response, "__await__"):
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(drf_request, response, *args, **kwargs)
        return self.response

    async def prepare(self, request: Request) -> None:
        """What a view does before authentication (default: nothing)."""

    async def ainitial(self, request: Request) -> None:
        """DRF's `initial()`, with authentication and throttles awaited."""
        self.format_kwarg = self.get_format_suffix(**self.kwargs)
        request.accepted_renderer, request.accepted_media_type = self.perform_content_negotiation(
            request
        )
        request.version, request.versioning_scheme = self.determine_version(
            request, *self.args, **self.kwargs
        )
        await self.aperform_authentication(request)
        self.check_permissions(request)
        await self.acheck_throttles(request)

    async def aperform_authentication(self, request: Request) -> None:
        for authenticator in self.get_authenticators():
            outcome = authenticator.authenticate(request)
            if hasattr(outcome, "__await__"):
                outcome = await outcome
            if outcome is not None:
                request.user, request.auth = outcome
                return
        # No authenticator claimed the request. Every view on this base requires a principal,
        # so this is DRF's NotAuthenticated (what IsAuthenticated would conclude).
        raise exceptions.NotAuthenticated()

    async def acheck_throttles(self, request: Request) -> None:
        waits: list[float | None] = []
        for throttle in self.get_throttles():
            allowed = throttle.allow_request(request, self)
            if hasattr(allowed, "__await__"):
                allowed = await allowed
            if not allowed:
                waits.append(throttle.wait())
        if waits:
            known = [w for w in waits if w is not None]
            raise exceptions.Throttled(max(known) if known else None)
