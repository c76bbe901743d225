from __future__ import annotations

from django.urls import path

from api.bridge import (
    BridgePairingCreateApi,
    BridgePairingRedeemApi,
    BridgeWorkerRevokeApi,
    BridgeWorkerStatusApi,
)
from api.execute.view import WorkspaceToolsExecuteApi
from api.requests import CapabilitiesApi, DurableRequestApi, DurableSubmitApi
from api.schema.docs import SchemaApi, SchemaDocsApi
from api.workers import WorkerDeregisterApi, WorkerHeartbeatApi, WorkerRegisterApi

urlpatterns = [
    path("v1/workspace-tools/execute", WorkspaceToolsExecuteApi.as_view(), name="execute"),
    path("v1/workspace-tools/capabilities", CapabilitiesApi.as_view(), name="capabilities"),
    path("v1/workspace-tools/requests", DurableSubmitApi.as_view(), name="request-submit"),
    path(
        # Any id, slashes included, reaches the view: an id that is not one is the same 404
        # REQUEST_NOT_FOUND as an unknown one, never the router's NOT_FOUND.
        "v1/workspace-tools/requests/<path:request_id>",
        DurableRequestApi.as_view(),
        name="request-cancel",
    ),
    path("v1/workers/register", WorkerRegisterApi.as_view(), name="worker-register"),
    path("v1/workers/heartbeat", WorkerHeartbeatApi.as_view(), name="worker-heartbeat"),
    path("v1/workers/deregister", WorkerDeregisterApi.as_view(), name="worker-deregister"),
    path("v1/bridge/pairings", BridgePairingCreateApi.as_view(), name="bridge-pairings"),
    path("v1/bridge/pairings/redeem", BridgePairingRedeemApi.as_view(), name="bridge-redeem"),
    path(
        "v1/bridge/workers/<str:worker_id>/status",
        BridgeWorkerStatusApi.as_view(),
        name="bridge-worker-status",
    ),
    path(
        "v1/bridge/workers/<str:worker_id>/revoke",
        BridgeWorkerRevokeApi.as_view(),
        name="bridge-worker-revoke",
    ),
    path("v1/schema/", SchemaApi.as_view(), name="openapi-schema"),
    path("v1/schema/docs/", SchemaDocsApi.as_view(), name="openapi-docs"),
]
