"""The admin login throttle's two hooks into django-axes (settings: AXES_*): the client address
it counts failures by, and the page a locked-out sign-in gets."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def remote_addr(request: HttpRequest) -> str | None:
    """The ASGI server's client address: the connection's peer, or the address a proxy it
    trusts (uvicorn's FORWARDED_ALLOW_IPS, loopback by default) reported. Forwarding headers
    are not read here: with no proxy in front, any client could write them."""
    return request.META.get("REMOTE_ADDR") or None


def lockout_response(request: HttpRequest, *_: Any) -> HttpResponse:
    """429 with Retry-After, on a page in the admin's own frame. axes calls this with one or
    two more arguments depending on the request path (sync or async); none is needed here."""
    cooloff_s = round(settings.AXES_COOLOFF_TIME * 3600)
    context = {
        **admin.site.each_context(request),
        "title": "Sign-in paused",
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "cooloff_minutes": cooloff_s // 60,
    }
    response = render(request, "admin/locked_out.html", context, status=429)
    response["Retry-After"] = str(cooloff_s)
    return response
