from __future__ import annotations

from django.urls import path

from dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.dashboard_index, name="index"),
    path("live/", views.live_fragment, name="live"),
    path("history/", views.history_fragment, name="history"),
    path("live.json", views.live_json, name="live-json"),
]
