"""The workspace endpoint's fast path through Django's middleware.

Calls to /v1/workspace-tools/ authenticate with bearer keys: they use no session, CSRF,
messages or cookie auth. Django runs each classic (sync) middleware of an async request in
two hops through one shared thread, a costly detour for calls that need none of it; so these
requests skip the rest of the chain and go straight to their async view, with the response
headers that chain would have added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import markcoroutinefunction
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from api.headers import API_HEADERS

FAST_PREFIX = "/v1/workspace-tools/"


class WorkspaceApiFastPath:
    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path_info.startswith(FAST_PREFIX):
            return await self.get_response(request)
        try:
            # What CommonMiddleware would have checked: the Host header against ALLOWED_HOSTS.
            request.get_host()
        except DisallowedHost:
            return JsonResponse(
                {"error": "This host is not served here.", "code": "INVALID_REQUEST"}, status=400
            )
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return await self.get_response(request)
        response: HttpResponse = await match.func(request, *match.args, **match.kwargs)
        # What Django's handler does for a deferred (DRF) response after the view returns.
        render = getattr(response, "render", None)
        if callable(render):
            response = render()
        for name, value in API_HEADERS.items():
            response.setdefault(name, value)
        return response
