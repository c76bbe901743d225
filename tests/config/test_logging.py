"""One log line per refusal: Django's own line for a 5xx answer of the workspace tools is
dropped (config/logging.py); an unhandled exception and every other path keep it."""

from __future__ import annotations

import logging

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response


def _django_lines(
    caplog: pytest.LogCaptureFixture, path: str, status: int, exception: Exception | None = None
) -> list[str]:
    caplog.clear()
    request = RequestFactory().post(path)
    log_response(
        "%s: %s",
        "Reason",
        request.path,
        response=HttpResponse(status=status),
        request=request,
        exception=exception,
    )
    return [r.getMessage() for r in caplog.records if r.name == "django.request"]


def test_a_typed_api_answer_gets_no_second_line_from_django(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        for path in ("/v1/workspace-tools/execute", "/v1/workspace-tools/requests"):
            for status in (500, 503, 504):
                assert _django_lines(caplog, path, status) == []


def test_other_paths_keep_djangos_line_for_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        assert _django_lines(caplog, "/healthz", 503) == ["Reason: /healthz"]
        assert _django_lines(caplog, "/v1/workers/heartbeat", 503) == [
            "Reason: /v1/workers/heartbeat"
        ]
        # An exception that reached Django unhandled keeps its line (and traceback) anywhere.
        unhandled = _django_lines(
            caplog, "/v1/workspace-tools/execute", 500, exception=RuntimeError("boom")
        )
        assert unhandled == ["Reason: /v1/workspace-tools/execute"]
        assert _django_lines(caplog, "/admin/", 500) == ["Reason: /admin/"]
        # 4xx stays below the logger's level, as before.
        assert _django_lines(caplog, "/admin/", 404) == []
