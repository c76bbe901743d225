from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from config.health import healthz
from dashboard.metrics import metrics_view
from dashboard.views import home

urlpatterns = [
    path("", home, name="home"),
    path("healthz", healthz, name="healthz"),
    path("", include("api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("dashboard/", include("dashboard.urls")),
    path("admin/", admin.site.urls),
]

handler400 = "api.fallback.bad_request"
handler404 = "api.fallback.not_found"
handler500 = "api.fallback.server_error"
