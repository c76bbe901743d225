"""Staff-only pages: the contention dashboard, its live fragment and its JSON.

Signed-out visitors go to the admin login; signed-in users who are not active staff get a
403, not a login loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dashboard.live import card_json, live_cards
from dashboard.panels import history_panels
from dashboard.window import DEFAULT_RANGE, RANGES, Window, parse_duration, step_label
from workspaces.models import Tenant, Worker

# The live cards refresh this often (the page's script reads it from the markup).
LIVE_REFRESH_MS = 2000
# The history half re-runs its queries this often: each is a scan of the window's rows.
HISTORY_REFRESH_MS = 30_000

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (user.is_active and user.is_staff):
            return render(request, "dashboard/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return wrapped


def _window(request: HttpRequest) -> tuple[Window, str]:
    chosen = request.GET.get("range", DEFAULT_RANGE)
    if chosen not in RANGES:
        chosen = DEFAULT_RANGE
    worker = request.GET.get("worker", "").strip()[:128] or None
    return Window.last(parse_duration(chosen), worker=worker), chosen


def _tenant(request: HttpRequest) -> int | None:
    """The tenant whose calls the live cards list (`?tenant=<id>`), or None for all."""
    chosen = request.GET.get("tenant", "")
    return int(chosen) if chosen.isdigit() else None


def _live_context(request: HttpRequest) -> dict[str, Any]:
    tenant_id = _tenant(request)
    return {
        "cards": live_cards(tenant_id=tenant_id),
        "tenant_id": tenant_id,
        "now": timezone.now(),
    }


def _step_label(window: Window) -> str:
    return step_label(window.step)


def _history_context(request: HttpRequest) -> dict[str, Any]:
    window, chosen = _window(request)
    return {
        "history": history_panels(window),
        "ranges": RANGES,
        "chosen_range": chosen,
        "workers": list(Worker.objects.order_by("worker_id").values_list("worker_id", flat=True)),
        "step_label": _step_label(window),
        "history_refresh_ms": HISTORY_REFRESH_MS,
        "history_refresh_s": HISTORY_REFRESH_MS // 1000,
        "now": timezone.now(),
    }


@require_GET
@never_cache
@staff_required
def history_fragment(request: HttpRequest) -> HttpResponse:
    """The history half alone, for the page to refresh itself with (same query string)."""
    return render(request, "dashboard/_history.html", _history_context(request))


@require_GET
@never_cache
@staff_required
def dashboard_index(request: HttpRequest) -> HttpResponse:
    context = {
        **_history_context(request),
        **_live_context(request),
        "tenants": list(Tenant.objects.order_by("name").values_list("pk", "name")),
        "refresh_ms": LIVE_REFRESH_MS,
        "refresh_s": LIVE_REFRESH_MS // 1000,
    }
    return render(request, "dashboard/index.html", context)


@require_GET
@never_cache
@staff_required
def live_fragment(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/_live.html", _live_context(request))


@require_GET
@never_cache
@staff_required
def live_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {
            "at": timezone.now().isoformat(),
            "workers": [card_json(c) for c in live_cards(tenant_id=_tenant(request))],
        }
    )


@require_GET
@never_cache
def home(request: HttpRequest) -> HttpResponse:
    """`/`: staff go to the dashboard; anyone else gets a pointer to what is served here."""
    user = request.user
    if user.is_authenticated and user.is_active and user.is_staff:
        return redirect("dashboard:index")
    return JsonResponse(
        {
            "service": "Sluice",
            "execute": "/v1/workspace-tools/execute",
            "schema": "/v1/schema/",
            "docs": "/v1/schema/docs/",
            "health": "/healthz",
            "dashboard": "/dashboard/",
            "admin": "/admin/",
        }
    )
