"""The contract text of each operation: tag, summary, long description, what its success
means, and one example (request and answer). Paths, parameters and responses come from the
views' `extend_schema`; this is only the prose and the examples beside them.
"""

from __future__ import annotations

from typing import Any

_WORKER = "example-worker-1"
_INCARNATION = "0f" * 16
_REQUEST_ID = "req_01HZX3Q8M2F7"
_READ = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "repo",
    "path": "README.md",
    "maxLines": 2,
}
_READ_RESULT = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "repo",
    "path": "README.md",
    "content": "# Example\nA line.",
    "startLine": 1,
    "endLine": 2,
    "truncated": True,
    "nextStartLine": 3,
}

TAGS: list[dict[str, str]] = [
    {"name": "workspace-tools", "description": "Agents (API keys)."},
    {"name": "workers", "description": "Worker machines (worker tokens)."},
    {"name": "bridge", "description": "Attaching workers from LibreChat (§4.5)."},
    {"name": "operations", "description": "Health and metrics."},
    {"name": "schema", "description": "This document."},
]

TEXTS: dict[str, dict[str, Any]] = {
    "executeWorkspaceTool": {
        "tag": "workspace-tools",
        "summary": "Run one workspace operation on a worker (waits for admission).",
        "description": "Every answer before the assignment may have reached the worker says "
        "the operation was not started (safe to resend); 502 and 504 mean it may have run. "
        "`x-codes` on each error body lists its codes, when each happens and whether the call "
        "started (contract §2.5).",
        "ok": "The worker's result. A command past its own timeout is a result "
        "(`timedOut: true`), not an error.",
        "request": _READ,
        "answer": _READ_RESULT,
    },
    "workspaceToolCapabilities": {
        "tag": "workspace-tools",
        "summary": "What this deployment offers beyond execute (contract §2.7).",
        "ok": "1: durable requests are offered; 0: use execute.",
        "answer": {"durableWorkspaceRequests": 1},
    },
    "submitDurableRequest": {
        "tag": "workspace-tools",
        "summary": "Submit a durable call: 202 once it is in its worker's queue.",
        "description": "Same headers and body as execute; the request id header is required. "
        "Refusals before the call is queued are execute's typed answers. Repeating an id this "
        "principal's durable call holds creates nothing and answers that call's status.",
        "ok": "Accepted (or already accepted): its status.",
        "request": _READ,
        "answer": {"requestId": _REQUEST_ID, "state": "queued"},
    },
    "durableRequestStatus": {
        "tag": "workspace-tools",
        "summary": "A durable call's status (same principal only).",
        "description": "Any API process answers; a completed status is kept for at least 10 "
        "minutes.",
        "ok": "The call's status.",
        "answer": {"requestId": _REQUEST_ID, "state": "completed", "result": _READ_RESULT},
    },
    "cancelRequest": {
        "tag": "workspace-tools",
        "summary": "Cancel a waiting call by its request id (same principal only).",
        "description": "A waiting call is removed and answers 409 REQUEST_CANCELLED; a running "
        "or finished call is untouched.",
        "ok": "The call's state.",
        "answer": {"state": "cancelled"},
    },
    "registerWorker": {
        "tag": "workers",
        "summary": "Register a worker: a new incarnation.",
        "ok": "Registered: the incarnation, its slots and its queue.",
        "request": {
            "workerId": _WORKER,
            "workspaces": [{"workspaceId": "repo", "operations": ["read_file", "list_files"]}],
            "slots": 4,
        },
        "answer": {"incarnationId": _INCARNATION, "slots": 4, "queue": f"worker.{_WORKER}"},
    },
    "heartbeatWorker": {
        "tag": "workers",
        "summary": "Keep an incarnation alive (every <= 10 s).",
        "ok": "Still the current incarnation.",
        "request": {"workerId": _WORKER, "incarnationId": _INCARNATION},
        "answer": {"ok": True},
    },
    "deregisterWorker": {
        "tag": "workers",
        "summary": "Drain done: go offline; calls still waiting get WORKER_OFFLINE.",
        "ok": "Offline; `offline` waiting calls were told.",
        "request": {"workerId": _WORKER, "incarnationId": _INCARNATION},
        "answer": {"ok": True, "offline": 0},
    },
    "createBridgePairing": {
        "tag": "bridge",
        "summary": "A single-use pairing code for a worker id of the caller's tenant.",
        "ok": "The code.",
        "request": {
            "workerId": _WORKER,
            "binding": {"tenantId": "acme", "principal": {"type": "user", "id": "u-42"}},
        },
        "answer": {
            "protocolVersion": 1,
            "workerId": _WORKER,
            "code": "Zk3v9Qm2LwP8sT1xYb6nR4cA7dE0fH5j",
            "expiresAt": "2026-01-01T12:10:00Z",
        },
    },
    "redeemBridgePairing": {
        "tag": "bridge",
        "summary": "Spend a pairing code for the worker's id, token and Redis URLs.",
        "description": "`runworker --pairing-code` calls it once. No key: the code is the "
        "credential.",
        "ok": "The worker's credentials (shown once).",
        "request": {"code": "Zk3v9Qm2LwP8sT1xYb6nR4cA7dE0fH5j", "protocolVersion": 1},
        "answer": {"protocolVersion": 1, "workerId": _WORKER, "workerToken": "wt_example"},
    },
    "bridgeWorkerStatus": {
        "tag": "bridge",
        "summary": "Whether the worker is online and ready, its lease and its offer.",
        "ok": "The status.",
        "answer": {"protocolVersion": 1, "workerId": _WORKER, "online": False, "ready": False},
    },
    "revokeBridgeWorker": {
        "tag": "bridge",
        "summary": "Revoke the worker's token and Redis user; waiting calls get "
        "WORKER_OFFLINE. Idempotent.",
        "ok": "Revoked.",
        "answer": {"protocolVersion": 1, "revoked": True},
    },
    "openapiSchema": {
        "tag": "schema",
        "summary": "This document (OpenAPI 3.1), generated from the views.",
        "ok": "OpenAPI 3.1",
        "answer": {"openapi": "3.1.0", "info": {"title": "Sluice"}, "paths": {}},
    },
    "openapiDocs": {
        "tag": "schema",
        "summary": "This document as an HTML page.",
        "ok": "HTML",
        "answer": "<!doctype html>...",
    },
}
