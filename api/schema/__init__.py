"""The OpenAPI 3.1 document of Sluice's public HTTP surface (`/v1/schema/`), and its docs page.

Written by hand: drf-spectacular cannot see the async execute endpoint. What can drift is not
typed twice. Request and result bodies take their field names, which fields are required and
their defaults from `sluice_protocol`'s own field tables, and every bound and pattern
from its constants, so the client, the server and this document agree by construction: a field
added to the protocol without a schema here fails the build (and tests/test_openapi_schema.py,
which also checks each bound against `validate_request`).

    patterns.py   the protocol's patterns, anchored, read alike by every validator
    bodies.py     request and result bodies per operation (§2.2)
    answers.py    typed errors per status (§2.5), the headers of §3
    document.py   components, security schemes, paths: the whole document
    docs.py       the two views, and the context of templates/schema/docs.html
"""

from __future__ import annotations

from api.schema.docs import schema_docs_view, schema_view
from api.schema.document import EXECUTE_PATH, openapi_document
from api.schema.patterns import PATTERNS

__all__ = ["EXECUTE_PATH", "PATTERNS", "openapi_document", "schema_docs_view", "schema_view"]
