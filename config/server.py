"""The HTTP protocol `make run` serves with: uvicorn's, with a deadline for each request's
headers and a bound on open connections (contract §2.8).

uvicorn closes a keep-alive connection idle for `--timeout-keep-alive`, but only once a first
response went out, and any byte (a slowly dribbled header) disarms that timer; a connection
that opens and never completes a request was held forever (18,500 of them exhausted this
process's file descriptors). Here every connection must complete its next request's headers
within `REQUEST_HEADER_TIMEOUT_S` of opening or of its last response, and a connection beyond
`MAX_CONNECTIONS` is closed as it opens. Use: `uvicorn --http config.server:SluiceHttpProtocol`.
`tests/config/test_server_protocol.py` pins the uvicorn hooks this leans on.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_HEADER_TIMEOUT_S = float(os.environ.get("SLUICE_REQUEST_HEADER_TIMEOUT_S", "10"))
MAX_CONNECTIONS = int(os.environ.get("SLUICE_MAX_CONNECTIONS", "4096"))


class SluiceHttpProtocol(HttpToolsProtocol):
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

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
        for name in ("connection_made", "on_headers_complete", "on_response_complete")
    }
