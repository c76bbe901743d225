"""The API's edge under abuse, on a real uvicorn process with raw sockets (contract §2.8):
authentication before any body is read, the size limit enforced while a body streams in,
idle and slow-header connections closed, a per-process cap on calls in flight, a share of it
per key however the key is spelled, a deadline for every body, a bound on headers, and the
bridge routes' rate limit."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as project_settings
from livesupport import PYTHON, Process, ensure_drainer, free_port, wait_until

import config.server
from admission.models import CompletionLog
from api.errors import ANSWERS

HEADER_TIMEOUT_S = 1.0
CAP = 4
PER_KEY = 2
BODY_TIMEOUT_S = 2
BRIDGE_LIMIT = 5


@pytest.fixture(scope="module")
def edge_server(live_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    yield from _serve(
        live_env
        | {
            "SLUICE_REQUEST_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "SLUICE_MAX_CALLS_IN_FLIGHT": str(CAP),
            "SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY": str(PER_KEY),
            "SLUICE_BRIDGE_RATE_LIMIT": f"{BRIDGE_LIMIT}/1m",
            "SLUICE_BRIDGE_REDEEM_RATE_LIMIT": f"{BRIDGE_LIMIT}/1m",
        }
    )


@pytest.fixture(scope="module")
def deadline_server(live_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A server whose bodies have a short deadline, and whose keys hold one call each (with
    the drainer that lands its rows)."""
    ensure_drainer(live_env)
    yield from _serve(
        live_env
        | {
            "SLUICE_REQUEST_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY": "1",
        }
    )


def _serve(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    port = free_port()
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


def _connect(server: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source`, any loopback address: each is a client address of its own
    (the redeem route's rate limit is per client address)."""
    return socket.create_connection(server, timeout=10, source_address=(source, 0))


def _head(
    key: str,
    extra: str = "",
    *,
    path: str = "/v1/workspace-tools/execute",
    method: str = "POST",
    scheme: str = "Bearer ",
) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {scheme}{key}\r\nContent-Type: application/json\r\n{extra}\r\n"
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


def _hold(server: tuple[str, int], key: str, scheme: str = "Bearer ") -> socket.socket:
    """An authenticated call whose body never ends: it stays in flight until closed (or
    until its body deadline)."""
    sock = _connect(server)
    sock.sendall(_head(key, "Content-Length: 100\r\n", scheme=scheme) + b"{")
    return sock


def _answer(
    server: tuple[str, int], key: str, scheme: str = "Bearer "
) -> tuple[int, dict[str, str], dict[str, Any]]:
    sock = _connect(server)
    sock.sendall(_head(key, "Content-Length: 2\r\n", scheme=scheme) + b"{}")
    try:
        return _read_response(sock)
    finally:
        sock.close()


def _overloaded_soon(
    server: tuple[str, int], key: str, scheme: str = "Bearer "
) -> tuple[int, dict[str, str], Any]:
    """The held calls count once the server has read their headers: ask until it says so."""
    deadline = time.monotonic() + 10
    while True:
        status, headers, body = _answer(server, key, scheme)
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
    # And the other bounds docs/api.md names.
    assert config.server.MAX_HEADER_BYTES == 64 * 1024
    assert project_settings.SLUICE_REQUEST_BODY_TIMEOUT_S == 30
    assert set(config.server.protocol_hooks()) == {
        "connection_made",
        "data_received",
        "on_headers_complete",
        "on_message_complete",
        "on_response_complete",
    }


def test_two_spellings_of_one_key_share_one_share(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    burst = account_factory()
    held = [_hold(edge_server, burst.api_key) for _ in range(PER_KEY)]
    # The same key, spelled as authentication still reads it: no share of its own.
    for scheme in ("Bearer  ", "bearer "):
        status, _, body = _overloaded_soon(edge_server, burst.api_key, scheme)
        assert (status, body["code"]) == (503, "SERVICE_OVERLOADED")
    for sock in held:
        sock.close()


def test_an_unauthenticated_execute_declaring_a_huge_body_gets_401_first(
    edge_server: tuple[str, int],
) -> None:
    sock = _connect(edge_server)
    sock.sendall(_head("not-a-key", f"Content-Length: {2 * 1024**3}\r\n"))
    status, _, body = _read_response(sock)
    assert (status, body["code"]) == (401, "UNAUTHENTICATED")


def test_a_header_past_the_limit_gets_431_as_it_arrives(edge_server: tuple[str, int]) -> None:
    sock = _connect(edge_server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    sent = 0

    def feed() -> None:
        nonlocal sent
        try:
            while sent < 48 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            return

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    status, headers, body = _read_response(sock)
    assert (status, body["code"]) == (431, config.server.HEADERS_TOO_LARGE_CODE)
    assert ANSWERS[config.server.HEADERS_TOO_LARGE_CODE].status == 431
    assert headers["connection"] == "close"
    _closed_within(sock, 5)
    feeder.join(10)
    assert sent < 16 * 1024 * 1024


def test_an_unauthenticated_body_to_redeem_is_refused_while_it_streams(
    edge_server: tuple[str, int],
) -> None:
    sock = _connect(edge_server, "127.0.3.1")
    sock.sendall(_head("", "Transfer-Encoding: chunked\r\n", path="/v1/bridge/pairings/redeem"))
    feeder = _Feeder(sock)
    feeder.start()
    status, headers, body = _read_response(sock)
    assert (status, body["code"]) == (413, "REQUEST_TOO_LARGE")
    assert headers["connection"] == "close"
    _closed_within(sock, 5)
    feeder.join(10)
    # Refused at the limit, not read (or written to a temporary file) to its end.
    assert feeder.sent < project_settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 16 * 1024 * 1024
    # A declared length past the limit is refused before any of it is read.
    sock = _connect(edge_server, "127.0.3.1")
    sock.sendall(
        _head("", f"Content-Length: {200 * 1024**2}\r\n", path="/v1/bridge/pairings/redeem")
    )
    status, _, body = _read_response(sock)
    assert (status, body["code"]) == (413, "REQUEST_TOO_LARGE")


def _post(
    server: tuple[str, int], path: str, body: bytes, *, key: str = "", source: str
) -> tuple[int, dict[str, str], Any]:
    sock = _connect(server, source)
    sock.sendall(_head(key, f"Content-Length: {len(body)}\r\n", path=path) + body)
    try:
        return _read_response(sock)
    finally:
        sock.close()


def test_bridge_refusals_of_a_body_say_so_in_plain_text(edge_server: tuple[str, int]) -> None:
    status, _, body = _post(
        edge_server, "/v1/bridge/pairings/redeem", b'{"code": 5}', source="127.0.3.2"
    )
    assert (status, body["code"]) == (400, "INVALID_REQUEST")
    assert body["error"] == "code: Not a valid string."


def test_redeem_is_rate_limited_per_client_address(edge_server: tuple[str, int]) -> None:
    redeem, code = "/v1/bridge/pairings/redeem", b'{"code": "' + b"x" * 32 + b'"}'
    for _ in range(BRIDGE_LIMIT):
        status, _, body = _post(edge_server, redeem, code, source="127.0.3.3")
        assert (status, body["code"]) == (404, "PAIRING_CODE_UNKNOWN")
    status, headers, body = _post(edge_server, redeem, code, source="127.0.3.3")
    assert (status, body["code"]) == (429, "BRIDGE_RATE_LIMITED")
    assert int(headers["retry-after"]) >= 1
    # Another address has a budget of its own.
    status, _, body = _post(edge_server, redeem, code, source="127.0.3.4")
    assert (status, body["code"]) == (404, "PAIRING_CODE_UNKNOWN")


def test_the_keyed_bridge_routes_are_rate_limited_per_key(
    edge_server: tuple[str, int], account_factory: Any
) -> None:
    owner, other = account_factory(), account_factory()
    status_path = f"/v1/bridge/workers/{owner.worker_id}/status"

    def status_of(key: str, scheme: str = "Bearer ") -> tuple[int, dict[str, str], Any]:
        sock = _connect(edge_server)
        sock.sendall(_head(key, path=status_path, method="GET", scheme=scheme))
        try:
            return _read_response(sock)
        finally:
            sock.close()

    for _ in range(BRIDGE_LIMIT):
        assert status_of(owner.api_key)[0] == 200
    # However the key is spelled, it is the same key's budget.
    status, headers, body = status_of(owner.api_key, "Bearer  ")
    assert (status, body["code"]) == (429, "BRIDGE_RATE_LIMITED")
    assert int(headers["retry-after"]) >= 1
    assert status_of(other.api_key)[0] == 404


def test_a_body_slower_than_its_deadline_gets_408_and_frees_its_place(
    deadline_server: tuple[str, int], account_factory: Any
) -> None:
    owner = account_factory()
    request_id = uuid.uuid4().hex
    slow = _connect(deadline_server)
    slow.sendall(
        _head(
            owner.api_key,
            f"Content-Length: 100\r\nX-LibreChat-Workspace-Request-Id: {request_id}\r\n",
        )
        + b"{"
    )
    # The slow call holds the key's one place while its body does not come...
    status, _, body = _overloaded_soon(deadline_server, owner.api_key)
    assert (status, body["code"]) == (503, "SERVICE_OVERLOADED")
    # ...until its deadline: refused, its connection closed, and the place free again.
    slow.settimeout(BODY_TIMEOUT_S + 10)
    status, headers, body = _read_response(slow)
    assert (status, body["code"]) == (408, "REQUEST_BODY_TIMEOUT")
    assert headers["connection"] == "close"
    _closed_within(slow, 5)
    status, _, body = _answer(deadline_server, owner.api_key)
    assert (status, body["code"]) == (400, "INVALID_WORKSPACE_TOOL_REQUEST")
    # Like every execute POST, it has its row.
    rows = wait_until(
        lambda: list(
            CompletionLog.objects.filter(request_id=request_id).values_list("http_status", "code")
        ),
        timeout_s=20,
    )
    assert rows == [(408, "REQUEST_BODY_TIMEOUT")]


def test_a_trickling_body_on_another_route_gets_408(deadline_server: tuple[str, int]) -> None:
    sock = _connect(deadline_server, "127.0.3.5")
    sock.sendall(_head("", "Content-Length: 100\r\n", path="/v1/bridge/pairings/redeem"))
    sock.settimeout(BODY_TIMEOUT_S + 10)
    sock.sendall(b"{")  # a start, and nothing more: the deadline is for the whole body
    status, headers, body = _read_response(sock)
    assert (status, body["code"]) == (408, "REQUEST_BODY_TIMEOUT")
    assert headers["connection"] == "close"
