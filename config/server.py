"""The HTTP protocol `make run` serves with: uvicorn's, with a deadline for each request's
headers and a bound on open connections (contract §2.8).

uvicorn closes a keep-alive connection idle for `--timeout-keep-alive`, but only once a first
response went out, and any byte (a slowly dribbled header) disarms that timer; a connection
that opens and never completes a request was held forever (18,500 of them exhausted this
process's file descriptors). Here every connection must complete its next request's headers
within `REQUEST_HEADER_TIMEOUT_S` of opening or of its last response, and a connection beyond
`MAX_CONNECTIONS` is closed as it opens. A request line and headers past `MAX_HEADER_BYTES` are
answered 431 REQUEST_HEADERS_TOO_LARGE as they arrive: httptools has no such limit and holds
a header value whole (and copies it as it grows) until it ends.
Use: `uvicorn --http config.server:SluiceHttpProtocol`.
`tests/config/test_server_protocol.py` pins the uvicorn hooks this leans on.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_HEADER_TIMEOUT_S = float(os.environ.get("SLUICE_REQUEST_HEADER_TIMEOUT_S", "10"))
MAX_CONNECTIONS = int(os.environ.get("SLUICE_MAX_CONNECTIONS", "4096"))
MAX_HEADER_BYTES = int(os.environ.get("SLUICE_MAX_HEADER_BYTES", str(64 * 1024)))

# Built here, not by api/errors.py: uvicorn imports this module before Django is set up. The
# code is the one api/errors.py's table lists (a test checks they agree).
HEADERS_TOO_LARGE_CODE = "REQUEST_HEADERS_TOO_LARGE"
_HEADERS_TOO_LARGE_BODY = json.dumps(
    {"error": "The request's headers are too large.", "code": HEADERS_TOO_LARGE_CODE}
).encode()
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"content-length: " + str(len(_HEADERS_TOO_LARGE_BODY)).encode() + b"\r\n"
    b"connection: close\r\n\r\n" + _HEADERS_TOO_LARGE_BODY
)


class SluiceHttpProtocol(HttpToolsProtocol):
    _header_deadline: asyncio.TimerHandle | None = None
    # Whether the bytes arriving belong to a request's line and headers (from the connection's
    # start or the last request's end, to its headers' end), and how many have so far. A
    # chunk that holds a header's end and body bytes counts whole: the bound is one read
    # beyond MAX_HEADER_BYTES, not exact.
    _in_headers = True
    _header_bytes = 0

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if (
            self._in_headers
            and self._header_bytes > MAX_HEADER_BYTES
            and not self.transport.is_closing()
        ):
            self.transport.write(HEADERS_TOO_LARGE)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_headers, self._header_bytes = False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(REQUEST_HEADER_TIMEOUT_S, self._too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_hooks() -> dict[str, Any]:
    """The uvicorn methods overridden above (the tripwire test checks they still exist)."""
    return {
        name: getattr(HttpToolsProtocol, name)
        for name in (
            "connection_made",
            "data_received",
            "on_headers_complete",
            "on_message_complete",
            "on_response_complete",
        )
    }
