"""Typed JSON for API paths that Django itself answers (unknown URL, unhandled error).

The admin and dashboard keep Django's HTML pages; anything under /v1/ (and /metrics,
/healthz) gets the typed body of contract §2.5, never HTML.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

API_PREFIXES = ("/v1/", "/metrics", "/healthz")


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"error": "No such endpoint.", "code": "NOT_FOUND"}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            {
                "error": "Internal error; the operation may or may not have run.",
                "code": "INTERNAL_ERROR",
            },
            status=500,
        )
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Django answers a disallowed Host (and similar) itself; an API path still gets JSON.
    if _is_api(request):
        return JsonResponse({"error": "Bad request.", "code": "INVALID_REQUEST"}, status=400)
    return defaults.bad_request(request, exception)
