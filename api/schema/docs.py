"""`/v1/schema/` and `/v1/schema/docs/`: the generated document as JSON, and as an HTML page.

The page is rendered on the server from the document (templates/schema/docs.html): no script,
nothing fetched from elsewhere. Both are public: the document holds no secret and no tenant
data.
"""

from __future__ import annotations

import functools
import html
import json
import re
from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from drf_spectacular.utils import extend_schema
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.errors import ANSWERS, WORKER_ANSWER, WORKER_ANSWERS
from api.schema.answers import REF, RETRY_AFTER, WWW_AUTHENTICATE, operation
from api.schema.bodies import Schema
from api.schema.generate import openapi_document


class _AlwaysJson(BaseContentNegotiation):
    """The page is HTML whatever the client accepts; its refusals are typed JSON."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class _PublicGet(APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    http_method_names = ["get", "head"]
    content_negotiation_class = _AlwaysJson


class SchemaApi(_PublicGet):
    @extend_schema(**operation("openapiSchema", ok=(200, {"type": "object"})))
    def get(self, request: Request) -> Response:
        return Response(openapi_document())


class SchemaDocsApi(_PublicGet):
    @extend_schema(**operation("openapiDocs", ok=(200, {"type": "string"}), media="text/html"))
    def get(self, request: Request) -> HttpResponse:
        return render(request._request, "schema/docs.html", docs_context())


# ---------------------------------------------------------------------------------------------
# The page's context

_REF_IN_HTML = re.compile(r"&quot;#/components/schemas/(\w+)&quot;")


def _pretty(value: Any) -> str:
    """Indented JSON, HTML-escaped, with each $ref turned into a link to its schema."""
    compact = json.dumps(value, ensure_ascii=False)
    text = html.escape(
        compact if len(compact) <= 90 else json.dumps(value, indent=1, ensure_ascii=False)
    )
    return _REF_IN_HTML.sub(r'&quot;<a href="#schema-\1">#/components/schemas/\1</a>&quot;', text)


def _constraints(schema: Schema) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).removeprefix(REF)
    parts = [str(schema.get("type", "any"))]
    for key in ("const", "enum"):
        if key in schema:
            parts.append(f"{key} {json.dumps(schema[key])}")
    if "pattern" in schema:
        parts.append(f"pattern {schema['pattern']}")  # as written, not JSON-escaped
    for key, label in (
        ("minimum", ">="),
        ("maximum", "<="),
        ("minLength", "chars >="),
        ("maxLength", "chars <="),
        ("x-maxUtf8Bytes", "UTF-8 bytes <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        if key in schema:
            parts.append(f"{label} {schema[key]}")
    if isinstance(schema.get("items"), dict):
        parts.append(f"of {_constraints(schema['items'])}")
    return ", ".join(parts)


def _fields(schema: Schema) -> list[dict[str, str]]:
    required = set(schema.get("required", []))
    return [
        {
            "name": name,
            "presence": "required"
            if name in required
            else f"default {json.dumps(field['default'])}"
            if "default" in field
            else "optional",
            "constraints": _constraints(field),
            "description": field.get("description", ""),
        }
        for name, field in schema.get("properties", {}).items()
    ]


def _body(schema: Schema, schemas: dict[str, Schema]) -> dict[str, Any]:
    """A request or result body as the page shows it: its schema's name, and its fields or,
    for a oneOf, its variants by discriminator value (never a bare $ref)."""
    name = str(schema.get("$ref", "")).removeprefix(REF)
    resolved = schemas.get(name, schema)
    mapping = resolved.get("discriminator", {}).get("mapping", {})
    return {
        "name": name,
        "fields": [] if mapping else _fields(resolved),
        "discriminator": resolved.get("discriminator", {}).get("propertyName", ""),
        "variants": [{"value": v, "name": ref.removeprefix(REF)} for v, ref in mapping.items()],
    }


def _example(content: Schema) -> str:
    examples = content.get("examples") or {}
    for example in examples.values():
        value = example.get("value")
        # A text answer reads as text, not as a JSON string.
        return html.escape(value) if isinstance(value, str) else _pretty(value)
    return ""


# Shown on the status row they come with, and explained once at the top of the page.
_ROW_HEADERS = (RETRY_AFTER, WWW_AUTHENTICATE)


def _code_row(row: dict[str, str]) -> dict[str, Any]:
    # A worker's own code may say more than WORKER_ANSWER (WORKER_ANSWERS); it is still no
    # service code.
    service = row["started"] != WORKER_ANSWER.started and row["code"] not in WORKER_ANSWERS
    return {**row, "retry": service and ANSWERS[row["code"]].retry_after}


def _response_rows(operation: Schema) -> list[dict[str, Any]]:
    rows = []
    for status, response in operation["responses"].items():
        media, content = next(iter(response.get("content", {"": {"schema": {}}}).items()))
        schema = content.get("schema", {})
        rows.append(
            {
                "status": status,
                "description": response.get("description", ""),
                "media": media,
                "codes": [_code_row(row) for row in schema.get("x-codes", [])],
                # Named in the row; the budget headers have their own table.
                "headers": [h for h in response.get("headers", {}) if h in _ROW_HEADERS],
                "schema": _pretty(schema),
                "example": _example(content),
            }
        )
    return rows


def _response_headers(operation: Schema) -> list[dict[str, Any]]:
    """Each response header once: where it appears, what it means there, its pattern."""
    headers: dict[str, dict[str, Any]] = {}
    for status, response in operation["responses"].items():
        for name, header in response.get("headers", {}).items():
            if name in _ROW_HEADERS:
                continue
            entry = headers.setdefault(
                name,
                {
                    "name": name,
                    "statuses": [],
                    "descriptions": [],
                    "pattern": header["schema"].get("pattern", header["schema"].get("const")),
                },
            )
            entry["statuses"].append(status)
            if header.get("description") and header["description"] not in entry["descriptions"]:
                entry["descriptions"].append(header["description"])
    statuses = list(operation["responses"])
    for entry in headers.values():
        rest = [s for s in statuses if s not in entry["statuses"]]
        entry["on"] = (
            "every answer"
            if not rest
            else f"all but {', '.join(rest)}"
            if len(rest) < len(entry["statuses"])
            else ", ".join(entry["statuses"])
        )
    return list(headers.values())


def _security(operation: Schema) -> list[str]:
    return [" + ".join(each) or "none" for each in operation.get("security", [])] or ["none"]


@functools.cache
def docs_context() -> dict[str, Any]:
    document = openapi_document()
    schemas = document["components"]["schemas"]
    endpoints = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            endpoints.append(
                {
                    "id": op["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "security": _security(op),
                    "parameters": [
                        {**param, "constraints": _constraints(param["schema"])}
                        for param in op.get("parameters", [])
                    ],
                    "body": _body(body["schema"], schemas) if body else None,
                    "body_example": _example(body) if body else "",
                    "responses": _response_rows(op),
                    "response_headers": _response_headers(op),
                }
            )
    return {
        "info": document["info"],
        "version": document["openapi"],
        "endpoints": endpoints,
        "schemas": [
            {"name": name, "fields": _fields(schema), "json": _pretty(schema)}
            for name, schema in schemas.items()
        ],
    }
