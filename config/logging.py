"""JSON log lines: one object a line, with the record's structured fields merged in."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else was passed through `extra=` and is a field.
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TypedApiAnswersFilter(logging.Filter):
    """Drops django.request's line for an answer of the workspace tools (`/v1/workspace-tools/`).

    Django logs every 5xx answer at ERROR ("Service Unavailable: /v1/..."). Every answer there
    is typed: an expected refusal (queue timeout, queue full, shutting down) is counted in
    /metrics and needs no line; Redis or Postgres away is logged once by the code that
    refused, without a traceback; an error nobody foresaw is logged there with its traceback.
    Django's line would double these, and a burst of refusals would fill the log with it. A
    record that carries an exception (one that reached Django unhandled) is always kept, and
    every other path (admin, dashboard, worker endpoints, /healthz) keeps Django's line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            return True
        # Here, not at the top: a worker (sluice-worker) configures this logging without the
        # server's HTTP modules, and never logs a request.
        from config.middleware import FAST_PREFIX

        request = getattr(record, "request", None)
        return not str(getattr(request, "path", "")).startswith(FAST_PREFIX)
