"""Staff actions on live traffic from the dashboard: cancel a waiting call, drain or resume a
worker (admission/operator.py does them and records each in the audit trail).

POSTs only, behind the same staff check as every dashboard page and Django's CSRF check.
The page's script sends them with `Accept: application/json` and repaints the live cards from
the answer; without the script, the form posts and the page reloads with the result.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from redis.exceptions import RedisError

from admission.operator import Actor, UnknownWorker, call_cancel, worker_drain, worker_resume
from dashboard.views import staff_required

CANCEL_ANSWERS = {
    "cancelled": (200, "Cancelled the waiting call; its client is answered REQUEST_CANCELLED."),
    "running": (409, "The call is running now; a running call is never cancelled."),
    "gone": (409, "The call is no longer waiting (granted, finished or gone)."),
}


def _answer(request: HttpRequest, status: int, message: str, **extra: object) -> HttpResponse:
    if "application/json" in request.headers.get("Accept", ""):
        return JsonResponse({"ok": status == 200, "message": message, **extra}, status=status)
    (messages.success if status == 200 else messages.warning)(request, message)
    back = request.POST.get("tenant", "")
    return redirect("/dashboard/" + (f"?tenant={back}" if back.isdigit() else "") + "#live")


def _field(request: HttpRequest, name: str) -> str:
    return request.POST.get(name, "").strip()[:128]


@require_POST
@never_cache
@staff_required
def call_cancel_view(request: HttpRequest) -> HttpResponse:
    worker_id, entry_id = _field(request, "worker"), _field(request, "entry")
    if not worker_id or not entry_id:
        return _answer(request, 400, "Name the worker and the call to cancel.")
    try:
        state = call_cancel(
            worker_id=worker_id, entry_id=entry_id, actor=Actor.of(request, via="dashboard")
        )
    except UnknownWorker:
        return _answer(request, 404, f"No worker {worker_id}.")
    except RedisError:
        return _answer(request, 503, "The admission Redis did not answer; nothing was changed.")
    status, message = CANCEL_ANSWERS[state]
    return _answer(request, status, message, state=state)


@require_POST
@never_cache
@staff_required
def worker_drain_view(request: HttpRequest) -> HttpResponse:
    worker_id = _field(request, "worker")
    resume = request.POST.get("resume") == "1"
    actor = Actor.of(request, via="dashboard")
    try:
        if resume:
            was, granted = worker_resume(worker_id=worker_id, actor=actor)
            message = (
                f"Resumed {worker_id}: {granted} waiting call(s) granted."
                if was
                else f"{worker_id} was not drained."
            )
        else:
            changed = worker_drain(worker_id=worker_id, actor=actor)
            message = (
                f"Draining {worker_id}: it grants nothing new; running calls finish."
                if changed
                else f"{worker_id} is drained already."
            )
    except UnknownWorker:
        return _answer(request, 404, f"No worker {worker_id}.")
    except RedisError:
        return _answer(request, 503, "The admission Redis did not answer; nothing was changed.")
    return _answer(request, 200, message, draining=not resume)
