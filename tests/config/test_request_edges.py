"""The API's edge under abuse, on a real uvicorn process with raw sockets (contract §2.8):
authentication before any body is read, the size limit enforced while a body streams in,
idle and slow-header connections closed, and a per-process cap on calls in flight."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as project_settings
from livesupport import PYTHON, Process, free_port

import config.server

HEADER_TIMEOUT_S = 1.0
CAP = 4
PER_KEY = 2


@pytest.fixture(scope="module")
def edge_server(live_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = live_env | {
        "SLUICE_REQUEST_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "SLUICE_MAX_CALLS_IN_FLIGHT": str(CAP),
        "SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY": str(PER_KEY),
    }
    proc = Process(
        [PYTHON, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--http", "config.server:SluiceHttpProtocol",
         "--timeout-keep-alive", "10", "--log-level", "warning", "--no-access-log"],
        env,
        f"edge:{port}",
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.alive(), proc.output()
            time.sleep(0.1)
    yield "127.0.0.1", port
    proc.stop()


def _connect(server: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(server, timeout=10)
    return sock


def _head(key: str, extra: str = "") -> bytes:
    return (
        "POST /v1/workspace-tools/execute HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n{extra}\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        while b"0\r\n\r\n" not in rest:
            chunk = sock.recv(65536)
            assert chunk, f"closed mid-answer: {rest!r}"
            rest += chunk
        body, size_line = b"", rest
        while True:
            size_text, _, size_line = size_line.partition(b"\r\n")
            size = int(size_text, 16)
            if size == 0:
                break
            body, size_line = body + size_line[:size], size_line[size + 2 :]
        return status, headers, json.loads(body)
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk
        rest += chunk
    return status, headers, json.loads(rest[:length]) if length else None


class _Feeder(threading.Thread):
    """Sends chunks of a body that never ends until the server stops taking them."""

    def __init__(self, sock: socket.socket, chunk: int = 64 * 1024) -> None:
        super().__init__(daemon=True)
        self.sock, self.chunk, self.sent = sock, chunk, 0

    def run(self) -> None:
        frame = f"{self.chunk:x}\r\n".encode() + b"x" * self.chunk + b"\r\n"
        try:
            while self.sent < 64 * 1024 * 1024:
                self.sock.sendall(frame)
                self.sent += self.chunk
        except OSError:
            return


def _closed_within(sock: socket.socket, timeout_s: float) -> float:
    started = time.monotonic()
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except (TimeoutError, ConnectionResetError) as exc:
        if isinstance(exc, TimeoutError):
            raise AssertionError(f"still open after {timeout_s} s") from None
    return time.monotonic() - started


def test_an_unauthenticated_body_that_never_ends_gets_401_without_being_read(
    edge_server: tuple[str, int],
) -> None:
    sock = _connect(edge_server)
    sock.sendall(_head("not-a-key", "Transfer-Encoding: chunked\r\n"))
    feeder = _Feeder(sock)
    feeder.start()
    status, headers, body = _read_response(sock)
    assert status == 401
    assert body["code"] == "UNAUTHENTICATED"
    assert headers.get("connection") == "close"
    _closed_within(sock, 5)
    feeder.join(10)
    # Refused and closed while the body was still coming: far less than the 64 MiB it would
    # have sent (the kernel's socket buffers and uvicorn's 64 KiB read-ahead at most).
    assert feeder.sent < 16 * 1024 * 1024


def test_a_chunked_body_past_the_limit_gets_413_while_it_streams(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    owner = account_factory()
    sock = _connect(edge_server)
    sock.sendall(
        _head(owner.api_key, f"X-LibreChat-Code-Worker-ID: {owner.worker_id}\r\n").replace(
            b"\r\n\r\n", b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
    )
    feeder = _Feeder(sock)
    feeder.start()
    status, _, body = _read_response(sock)
    assert status == 413
    assert body["code"] == "REQUEST_TOO_LARGE"
    _closed_within(sock, 5)
    feeder.join(10)
    assert feeder.sent < project_settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 16 * 1024 * 1024


def test_a_declared_length_past_the_limit_gets_413_before_any_body(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    owner = account_factory()
    sock = _connect(edge_server)
    sock.sendall(_head(owner.api_key, f"Content-Length: {2 * 1024**3}\r\n"))
    status, _, body = _read_response(sock)
    assert (status, body["code"]) == (413, "REQUEST_TOO_LARGE")


def test_a_connection_that_sends_nothing_is_closed(edge_server: tuple[str, int]) -> None:
    sock = _connect(edge_server)
    assert _closed_within(sock, HEADER_TIMEOUT_S + 5) >= HEADER_TIMEOUT_S * 0.9


def test_a_connection_dribbling_its_headers_is_closed(edge_server: tuple[str, int]) -> None:
    sock = _connect(edge_server)
    started = time.monotonic()
    head = _head("k")
    closed = False
    for i in range(len(head)):
        try:
            sock.sendall(head[i : i + 1])
        except OSError:
            closed = True
            break
        sock.settimeout(0.2)
        try:
            if sock.recv(1) == b"":
                closed = True
                break
        except TimeoutError:
            pass
        if time.monotonic() - started > HEADER_TIMEOUT_S + 5:
            break
    assert closed, "a slow header kept its connection open"
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 5


def _hold(server: tuple[str, int], key: str) -> socket.socket:
    """An authenticated call whose body never ends: it stays in flight until closed."""
    sock = _connect(server)
    sock.sendall(_head(key, "Content-Length: 100\r\n") + b"{")
    return sock


def _answer(server: tuple[str, int], key: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    sock = _connect(server)
    sock.sendall(_head(key, "Content-Length: 2\r\n") + b"{}")
    try:
        return _read_response(sock)
    finally:
        sock.close()


def _overloaded_soon(server: tuple[str, int], key: str) -> tuple[int, dict[str, str], Any]:
    """The held calls count once the server has read their headers: ask until it says so."""
    deadline = time.monotonic() + 10
    while True:
        status, headers, body = _answer(server, key)
        if status == 503 or time.monotonic() > deadline:
            return status, headers, body


def test_calls_past_the_in_flight_cap_get_service_overloaded(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    # Two callers each fill their share, so together they fill the process.
    first, second = account_factory(), account_factory()
    held = [_hold(edge_server, first.api_key) for _ in range(PER_KEY)]
    held += [_hold(edge_server, second.api_key) for _ in range(CAP - PER_KEY)]
    status, headers, body = _overloaded_soon(edge_server, account_factory().api_key)
    assert (status, body["code"]) == (503, "SERVICE_OVERLOADED")
    assert headers["retry-after"] == "1"
    for sock in held:
        sock.close()


def test_one_credentials_burst_fills_only_its_share_of_the_calls_in_flight(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    burst, other = account_factory(), account_factory()
    held = [_hold(edge_server, burst.api_key) for _ in range(PER_KEY)]
    status, headers, body = _overloaded_soon(edge_server, burst.api_key)
    assert (status, body["code"], headers["retry-after"]) == (503, "SERVICE_OVERLOADED", "1")
    # The process still has room, and another caller gets it: its call is read and answered
    # on its merits (a body of {} is not a request).
    status, _, body = _answer(edge_server, other.api_key)
    assert (status, body["code"]) == (400, "INVALID_WORKSPACE_TOOL_REQUEST")
    for sock in held:
        sock.close()
    # Once the burst's calls are gone, its share is free again.
    deadline = time.monotonic() + 10
    while (status := _answer(edge_server, burst.api_key)[0]) == 503:
        assert time.monotonic() < deadline, "the share stayed full after its calls ended"
    assert status == 400


def test_the_default_header_deadline_is_10_s() -> None:
    assert config.server.REQUEST_HEADER_TIMEOUT_S == 10.0
    assert set(config.server.protocol_hooks()) == {
        "connection_made",
        "on_headers_complete",
        "on_response_complete",
    }
