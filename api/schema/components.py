"""Named schemas of the document, and the bodies of execute as oneOf by `operation`.

A `Component` is a serializer that stands for a JSON Schema written out (the protocol's
bodies, which DRF fields cannot express: UTF-8 byte bounds, integer literals, `const`, the
instruction-read rule); `ComponentExtension` (api/schema/extensions.py) hands drf-spectacular
that schema. The execute request and result are drf-spectacular's PolymorphicProxySerializer
over the seven operations, discriminated by `operation`.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import sluice_protocol as p
from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from api.schema.bodies import Schema, request_schema, result_schema, string, title
from workspaces.runtime.config import MAX_SLOTS

# Every component by name.
COMPONENTS: dict[str, type[Component]] = {}


class Component(serializers.Serializer):
    """A schema component given as JSON Schema (see the module docstring)."""

    schema: ClassVar[Schema] = {}


def component(name: str, schema: Schema) -> type[Component]:
    """The component `name` (one class per name, so every use names the same schema)."""
    made = COMPONENTS.get(name)
    if made is None:
        made = COMPONENTS[name] = type(
            name, (Component,), {"schema": schema, "__module__": __name__}
        )
    elif made.schema != schema:
        raise RuntimeError(f"two different schemas are named {name}")
    return made


def _polymorphic(kind: str, build: Any) -> PolymorphicProxySerializer:
    operations = sorted(p.OPERATIONS)
    return PolymorphicProxySerializer(
        component_name="Execute" + kind,
        serializers={op: component(title(op, kind), build(op)) for op in operations},
        resource_type_field_name="operation",
        many=False,
    )


@functools.cache
def execute_request() -> PolymorphicProxySerializer:
    return _polymorphic("Request", request_schema)


@functools.cache
def execute_result() -> PolymorphicProxySerializer:
    return _polymorphic("Result", result_schema)


def exact(required: list[str], description: str = "", **properties: Schema) -> Schema:
    schema: Schema = {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": properties,
    }
    if description:
        schema["description"] = description
    return schema


DurableStatus = component(
    "DurableStatus",
    exact(
        ["requestId", "state"],
        requestId=string("requestId"),
        state={
            "type": "string",
            "enum": ["queued", "admitted", "completed", "failed", "cancelled"],
        },
        result={"type": "object", "description": "The §2.2 result (completed)."},
        error=exact(
            ["code", "message"],
            "failed: the code the synchronous endpoint would have answered, except a revoked "
            "key (WORKER_UNAUTHORIZED) and a stopping service (WORKER_OFFLINE): docs/api.md.",
            code={"type": "string"},
            message={"type": "string"},
        ),
    ),
)
CancelState = component(
    "CancelState",
    exact(["state"], state={"type": "string", "enum": ["cancelled", "running", "finished"]}),
)
Capabilities = component(
    "Capabilities",
    exact(
        ["durableWorkspaceRequests"],
        durableWorkspaceRequests={"type": "integer", "enum": [0, 1]},
    ),
)
Registered = component(
    "Registered",
    exact(
        ["incarnationId", "slots", "queue"],
        incarnationId=string("incarnationId"),
        slots={"type": "integer", "minimum": 1, "maximum": MAX_SLOTS},
        queue={"type": "string", "description": "The worker's own Celery queue."},
    ),
)
HeartbeatOk = component("HeartbeatOk", exact(["ok"], ok={"type": "boolean", "const": True}))
Deregistered = component(
    "Deregistered",
    exact(
        ["ok", "offline"],
        ok={"type": "boolean", "const": True},
        offline={"type": "integer", "minimum": 0, "description": "Waiting calls told to leave."},
    ),
)
