from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from admission import views as admission_views
from config.health import healthz
from config.schema import schema_docs_view, schema_view
from dashboard.metrics import metrics_view
from workspaces import views as worker_views

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("v1/workspace-tools/execute", admission_views.execute, name="execute"),
    path(
        "v1/workspace-tools/requests/<str:request_id>",
        admission_views.request_cancel,
        name="request-cancel",
    ),
    path("v1/workers/register", worker_views.WorkerRegisterApi.as_view(), name="worker-register"),
    path(
        "v1/workers/heartbeat", worker_views.WorkerHeartbeatApi.as_view(), name="worker-heartbeat"
    ),
    path(
        "v1/workers/deregister",
        worker_views.WorkerDeregisterApi.as_view(),
        name="worker-deregister",
    ),
    path("v1/schema/", schema_view, name="openapi-schema"),
    path("v1/schema/docs/", schema_docs_view, name="openapi-docs"),
    path("metrics", metrics_view, name="metrics"),
    path("dashboard/", include("dashboard.urls")),
    path("admin/", admin.site.urls),
]

handler400 = "config.errors.bad_request"
handler404 = "config.errors.not_found"
handler500 = "config.errors.server_error"
