"""The schema class of every DRF view, and the generator that walks the URLconf.

`SluiceAutoSchema` refuses to guess: an operation whose view declares no responses with
`extend_schema` (api/schema/answers.py `operation()`) stops the generation, so a route added to
api/urls.py without its schema cannot be served undocumented (tests/test_openapi_schema.py).
`SluiceSchemaGenerator` makes each view without running its constructor: the async views open
their event loop's Redis pool there, and generation runs on no loop.
"""

from __future__ import annotations

from typing import Any

from django.views import View
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from drf_spectacular.openapi import AutoSchema


class SchemaMissing(Exception):
    """A view's operation declares no schema."""


class SluiceAutoSchema(AutoSchema):
    def get_response_serializers(self) -> Any:
        raise SchemaMissing(
            f"{self.method} {self.path} ({type(self.view).__name__}) declares no responses: "
            "decorate it with @extend_schema(**operation(...)) from api/schema/answers.py"
        )


_schema_only: dict[type, type] = {}


def _without_constructor(cls: type) -> type:
    """`cls` with Django's own constructor instead of the view's (no connection opened)."""
    if cls not in _schema_only:
        _schema_only[cls] = type(
            cls.__name__,
            (cls,),
            {"__init__": View.__init__, "__module__": cls.__module__,
             "__qualname__": cls.__qualname__},
        )  # fmt: skip
    return _schema_only[cls]


class _Endpoints(EndpointEnumerator):
    def get_allowed_methods(self, callback: Any) -> list[str]:
        cls = callback.cls
        return [
            method.upper()
            for method in cls.http_method_names
            if hasattr(cls, method) and method not in ("options", "head", "trace", "connect")
        ]


class SluiceSchemaGenerator(SchemaGenerator):
    endpoint_inspector_cls = _Endpoints

    def create_view(self, callback: Any, method: str, request: Any = None) -> Any:
        # `callback.cls` is only read here: Django's view function keeps its own class.
        original = callback.cls
        callback.cls = _without_constructor(original)
        try:
            return super().create_view(callback, method, request)
        finally:
            callback.cls = original
