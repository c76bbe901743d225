"""A DRF validation error reads as plain text in the typed error body, never as the repr of
DRF's ErrorDetail objects (the bridge routes' INVALID_REQUEST)."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError

from api.errors import exception_handler


def test_a_nested_validation_error_names_each_field_in_plain_text() -> None:
    exc = ValidationError(
        {
            "workerId": ["Not a valid string."],
            "binding": {"principal": {"type": ['"x" is not a valid choice.']}},
            "non_field_errors": ["Unknown field(s): x."],
        }
    )
    response = exception_handler(exc, {})
    assert response is not None and response.status_code == 400
    assert response.data == {
        "error": 'workerId: Not a valid string.; binding.principal.type: "x" is not a valid '
        "choice.; Unknown field(s): x.",
        "code": "INVALID_REQUEST",
    }
