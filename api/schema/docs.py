"""`/v1/schema/` and `/v1/schema/docs/`: the document as JSON, and as an HTML page.

The page is rendered on the server from the document (templates/schema/docs.html): no script,
nothing fetched from elsewhere.
"""

from __future__ import annotations

import functools
import html
import json
import re
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from api.schema.answers import REF as _REF
from api.schema.bodies import Schema
from api.schema.document import openapi_document

# Public, no authentication: the document holds no secret and no tenant data.


def _only_get(request: HttpRequest) -> JsonResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    response = JsonResponse({"error": "Use GET.", "code": "METHOD_NOT_ALLOWED"}, status=405)
    response["Allow"] = "GET, HEAD"
    return response


def schema_view(request: HttpRequest) -> HttpResponse:
    return _only_get(request) or JsonResponse(openapi_document())


def schema_docs_view(request: HttpRequest) -> HttpResponse:
    return _only_get(request) or render(request, "schema/docs.html", docs_context())


_REF_IN_HTML = re.compile(r"&quot;#/components/schemas/(\w+)&quot;")


def _pretty(schema: Any) -> str:
    """Indented JSON, HTML-escaped, with each $ref turned into a link to its schema."""
    text = html.escape(json.dumps(schema, indent=2))
    return _REF_IN_HTML.sub(r'&quot;<a href="#schema-\1">#/components/schemas/\1</a>&quot;', text)


def _constraints(schema: Schema) -> str:
    if "$ref" in schema:
        return schema["$ref"].removeprefix(_REF)
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


def _response_rows(operation: Schema) -> list[dict[str, Any]]:
    rows = []
    for status, response in operation["responses"].items():
        media, content = next(iter(response.get("content", {"": {"schema": {}}}).items()))
        rows.append(
            {
                "status": status,
                "description": response["description"],
                "media": media,
                "codes": response.get("x-codes", []),
                "headers": list(response.get("headers", {})),
                "schema": _pretty(content["schema"]),
            }
        )
    return rows


def _response_headers(operation: Schema) -> list[dict[str, Any]]:
    """Each response header once: where it appears, what it means there, its pattern."""
    headers: dict[str, dict[str, Any]] = {}
    for status, response in operation["responses"].items():
        for name, header in response.get("headers", {}).items():
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
    return list(headers.values())


@functools.cache
def docs_context() -> dict[str, Any]:
    document = openapi_document()
    endpoints = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            endpoints.append(
                {
                    "id": operation["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "summary": operation["summary"],
                    "description": operation.get("description", ""),
                    "security": [" + ".join(each) or "none" for each in operation["security"]]
                    or ["none"],
                    "parameters": [
                        {**param, "constraints": _constraints(param["schema"])}
                        for param in operation.get("parameters", [])
                    ],
                    "body": _pretty(body["schema"]) if body else "",
                    "responses": _response_rows(operation),
                    "response_headers": _response_headers(operation),
                }
            )
    schemas = [
        {"name": name, "fields": _fields(schema), "json": _pretty(schema)}
        for name, schema in document["components"]["schemas"].items()
    ]
    return {
        "info": document["info"],
        "version": document["openapi"],
        "endpoints": endpoints,
        "schemas": schemas,
    }
