"""drf-spectacular extensions: the security schemes of the API's authenticators, the schema
components written as JSON Schema, and the views' strict serializers (unknown keys refused).

Importing this module registers them (api/schema/generate.py does, before generating).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from drf_spectacular.drainage import set_override
from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema

from api.authentication import AsyncApiKeyAuthentication
from api.schema.bodies import Schema
from api.workers import StrictSerializer


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.ApiKeyAuthentication"
    match_subclasses = True  # AsyncApiKeyAuthentication, the same key
    name = "apiKey"

    def get_security_definition(self, auto_schema: AutoSchema) -> Schema:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key (a principal of a tenant): `Authorization: Bearer <key>`.",
        }


# The async views check the same key the same way: one scheme, not a name clash.
set_override(AsyncApiKeyAuthentication, "suppress_collision_warning", True)


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.WorkerTokenAuthentication"
    name = "workerToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> Schema:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A worker token; it acts only as its own worker.",
        }


class ComponentExtension(OpenApiSerializerExtension):
    """A `Component` is its JSON Schema, under its own name."""

    target_class = "api.schema.components.Component"
    match_subclasses = True

    def get_name(self, auto_schema: AutoSchema, direction: Any) -> str:
        return str(self.target_class_name())

    def target_class_name(self) -> str:
        target = self.target if isinstance(self.target, type) else type(self.target)
        return target.__name__

    def map_serializer(self, auto_schema: AutoSchema, direction: Any) -> Schema:
        target = self.target if isinstance(self.target, type) else type(self.target)
        return copy.deepcopy(target.schema)  # type: ignore[attr-defined]


# Python's end anchor; JSON Schema patterns are ECMA 262, where it is `$`.
_PY_END = re.compile(r"\\Z$")


def _ecma(schema: Any) -> None:
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            schema["pattern"] = _PY_END.sub("$", schema["pattern"])
            if not schema["pattern"].startswith("^"):
                schema["pattern"] = "^" + schema["pattern"]
        for value in schema.values():
            _ecma(value)
    elif isinstance(schema, list):
        for value in schema:
            _ecma(value)


class StrictSerializerExtension(OpenApiSerializerExtension):
    """The views' StrictSerializer refuses unknown keys: `additionalProperties: false`."""

    target_class = "api.workers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: Any) -> Schema:
        schema: Schema = auto_schema._map_basic_serializer(self.target, direction)
        schema["additionalProperties"] = False
        if schema.get("description") == (StrictSerializer.__doc__ or "").strip():
            del schema["description"]  # the base class's docstring, not the body's
        _ecma(schema)
        return schema
