from __future__ import annotations

from django.urls import path

from dashboard import actions, views

app_name = "dashboard"

urlpatterns = [
    path("", views.dashboard_index, name="index"),
    path("live/", views.live_fragment, name="live"),
    path("history/", views.history_fragment, name="history"),
    path("live.json", views.live_json, name="live-json"),
    path("actions/cancel/", actions.call_cancel_view, name="cancel-call"),
    path("actions/drain/", actions.worker_drain_view, name="drain-worker"),
]
