"""/healthz and /metrics: answered by plain Django views (config/health.py,
dashboard/metrics.py), which drf-spectacular does not see, so the two operations are written
here and added by a postprocessing hook. Every other path comes from a DRF view.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from api.schema.bodies import Schema
from api.schema.components import COMPONENTS, exact

_CHECK: Schema = {"type": "string", "pattern": "^(?:ok|down: [A-Za-z0-9_.]+)$"}
HEALTH: Schema = exact(["database", "redis"], database=_CHECK, redis=_CHECK)
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_HEALTH_JSON = {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}

# route name in config/urls.py -> (path, operation)
OPERATIONAL: dict[str, tuple[str, Schema]] = {
    "healthz": (
        "/healthz",
        {
            "operationId": "healthz",
            "tags": ["operations"],
            "summary": "Postgres and Redis reachability.",
            "security": [],
            "responses": {
                "200": {
                    "description": "Both answer.",
                    "content": {
                        k: {**v, "examples": {"up": {"value": {"database": "ok", "redis": "ok"}}}}
                        for k, v in _HEALTH_JSON.items()
                    },
                },
                "503": {"description": "One is down.", "content": _HEALTH_JSON},
            },
        },
    ),
    "metrics": (
        "/metrics",
        {
            "operationId": "metrics",
            "tags": ["operations"],
            "summary": "Prometheus text exposition (contract §5).",
            "description": "For a scraper holding METRICS_TOKEN (a bearer token) or an active "
            "staff member's session; the client address counts for nothing. Answers in text, "
            "errors included.",
            "security": [{"metricsToken": []}, {"staffSession": []}],
            "responses": {
                "200": {
                    "description": "Prometheus text format.",
                    "content": {
                        "text/plain": {
                            "schema": {"type": "string"},
                            "examples": {
                                "scrape": {
                                    "value": 'sluice_queue_waiting{worker="example-worker-1"} 0.0\n'
                                }
                            },
                        }
                    },
                },
                "401": {
                    "description": "No staff session, and the token is missing or wrong (or "
                    "METRICS_TOKEN is not set). Carries `WWW-Authenticate: Bearer`.",
                    "content": _TEXT,
                },
                "403": {
                    "description": "Signed in, but not as active staff.",
                    "content": _TEXT,
                },
                "503": {"description": "Redis or Postgres is down.", "content": _TEXT},
            },
        },
    ),
}


def finish(result: Schema, **kwargs: Any) -> Schema:
    """drf-spectacular postprocessing hook: the two operations above, their schema and scheme;
    the components the refusal bodies name by $ref (RateLimited); and every request body
    marked required (no route of this API takes an empty one)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for name in sorted(set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(result)))):
        if name not in schemas and name in COMPONENTS:
            schemas[name] = copy.deepcopy(COMPONENTS[name].schema)
    _drop_enum_ids(result)
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if "requestBody" in operation:
                operation["requestBody"]["required"] = True
    for path, operation in OPERATIONAL.values():
        result.setdefault("paths", {})[path] = {"get": operation}
    components = result.setdefault("components", {})
    components.setdefault("schemas", {})["Health"] = HEALTH
    components.setdefault("securitySchemes", {})["metricsToken"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "METRICS_TOKEN.",
    }
    components["securitySchemes"]["staffSession"] = {
        "type": "apiKey",
        "in": "cookie",
        "name": "sessionid",
        "description": "An active staff member's admin session.",
    }
    return result


def _drop_enum_ids(schema: Any) -> None:
    """drf-spectacular's enum bookkeeping (`x-spec-enum-id`), left since enums stay inline."""
    if isinstance(schema, dict):
        schema.pop("x-spec-enum-id", None)
        for value in schema.values():
            _drop_enum_ids(value)
    elif isinstance(schema, list):
        for value in schema:
            _drop_enum_ids(value)
