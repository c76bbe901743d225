"""Rule 6: a cancel stops a wait at once, aborts an in-flight request, and nothing is sent
after it. Timing tests assert bounds, never exact sleeps.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from scripted import BASE_URL, READ, Runner, queue_timeout
from sluice_client import AsyncClient, Client, WorkspaceToolError

PROMPTLY_S = 1.0


class SilentServer:
    """A real socket that accepts one HTTP request and never answers it."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.got_request = threading.Event()
        self.client_hung_up = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        conn.settimeout(10)
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            self.got_request.set()
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            self.client_hung_up.set()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


# -- sync -----------------------------------------------------------------------------------------


def test_a_set_event_sends_nothing(sync_runner: Runner) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(WorkspaceToolError) as caught:
        sync_runner.execute(cancel=cancel)
    assert (caught.value.reason, caught.value.not_started) == ("cancelled", True)
    assert sync_runner.script.sent == []


def test_a_cancel_stops_a_real_wait_at_once_and_sends_nothing_more(sync_runner: Runner) -> None:
    cancel = threading.Event()
    sync_runner.script.then(queue_timeout("30"))
    threading.Timer(0.1, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(WorkspaceToolError) as caught:
        sync_runner.execute(cancel=cancel, client={"clock": time.monotonic, "sleep": None})
    assert time.monotonic() - started < PROMPTLY_S
    assert (caught.value.reason, caught.value.not_started) == ("cancelled", True)
    assert "not started" not in caught.value.message.lower()
    assert len(sync_runner.script.sent) == 1


def test_a_cancel_during_an_injected_sleep_stops_the_retry(sync_runner: Runner) -> None:
    cancel = threading.Event()

    def sleep(seconds: float) -> None:
        sync_runner.time.sleep(seconds)
        cancel.set()

    sync_runner.script.then(queue_timeout())
    with pytest.raises(WorkspaceToolError) as caught:
        sync_runner.execute(cancel=cancel, client={"sleep": sleep})
    assert caught.value.reason == "cancelled" and len(sync_runner.script.sent) == 1


@pytest.mark.parametrize(("state", "not_started"), [("running", False), ("cancelled", True)])
def test_a_cancel_aborts_an_in_flight_request_at_once(
    sync_runner: Runner, state: str, not_started: bool
) -> None:
    # Before the socket goes, the call is withdrawn: only Sluice's "cancelled" (dropped from
    # its queue unstarted) makes the outcome known.
    cancel, release = threading.Event(), threading.Event()

    def stuck(request: httpx.Request) -> httpx.Response:
        cancel.set()
        release.wait(5)
        return httpx.Response(200, json={})

    sync_runner.script.then(stuck).then(httpx.Response(200, json={"state": state}))
    started = time.monotonic()
    try:
        with pytest.raises(WorkspaceToolError) as caught:
            sync_runner.execute(cancel=cancel)
    finally:
        release.set()
    assert time.monotonic() - started < PROMPTLY_S
    assert (caught.value.reason, caught.value.not_started) == ("cancelled", not_started)
    assert ("may have run" in str(caught.value)) is not not_started
    post, delete = sync_runner.script.sent
    assert delete.request.method == "DELETE"
    assert delete.request.url.path.endswith(post.headers["X-LibreChat-Workspace-Request-Id"])


def test_a_cancel_shuts_the_real_socket_so_the_server_sees_the_disconnect(
    silent_server: SilentServer,
) -> None:
    cancel = threading.Event()

    def cancel_once_sent() -> None:
        silent_server.got_request.wait(5)
        cancel.set()

    threading.Thread(target=cancel_once_sent, daemon=True).start()
    started = time.monotonic()
    with (
        Client(silent_server.url, api_key="k") as client,
        pytest.raises(WorkspaceToolError) as caught,
    ):
        client.execute(READ, cancel=cancel)
    assert time.monotonic() - started < 5
    assert caught.value.reason == "cancelled" and not caught.value.not_started
    assert silent_server.client_hung_up.wait(PROMPTLY_S)


# -- async ----------------------------------------------------------------------------------------


def test_cancelling_the_task_stops_a_wait_at_once() -> None:
    runner = Runner("async")

    async def main() -> float:
        answered = asyncio.Event()

        def busy(request: httpx.Request) -> httpx.Response:
            answered.set()
            return queue_timeout("30")

        runner.script.then(busy)
        async with AsyncClient(
            BASE_URL, api_key="k", transport=runner.script.transport()
        ) as client:
            task = asyncio.create_task(client.execute(READ))
            await answered.wait()
            await asyncio.sleep(0.02)  # let the client start its 30 s wait
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - started

    assert asyncio.run(main()) < PROMPTLY_S
    assert len(runner.script.sent) == 1


def test_cancelling_the_task_aborts_an_in_flight_request() -> None:
    aborted: list[httpx.Request] = []

    async def stuck(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            aborted.append(request)
            raise
        return httpx.Response(500)

    async def main() -> None:
        async with AsyncClient(
            BASE_URL, api_key="k", transport=httpx.MockTransport(stuck)
        ) as client:
            task = asyncio.create_task(client.execute(READ))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert len(aborted) == 1


@pytest.mark.parametrize(("state", "not_started"), [("running", False), ("cancelled", True)])
def test_an_asyncio_event_aborts_an_in_flight_request_with_a_cancelled_error(
    state: str, not_started: bool
) -> None:
    async def stuck(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(200, json={"state": state})
        cancel.set()
        await asyncio.sleep(60)
        return httpx.Response(500)

    async def main() -> WorkspaceToolError:
        async with AsyncClient(
            BASE_URL, api_key="k", transport=httpx.MockTransport(stuck)
        ) as client:
            with pytest.raises(WorkspaceToolError) as caught:
                await client.execute(READ, cancel=cancel)
            return caught.value

    cancel = asyncio.Event()
    started = time.monotonic()
    error = asyncio.run(main())
    assert time.monotonic() - started < PROMPTLY_S
    assert (error.reason, error.not_started) == ("cancelled", not_started)


def test_an_asyncio_event_stops_a_wait_with_a_cancelled_error() -> None:
    runner = Runner("async")
    runner.script.then(queue_timeout("30"))

    async def main() -> WorkspaceToolError:
        cancel = asyncio.Event()
        async with AsyncClient(
            BASE_URL, api_key="k", transport=runner.script.transport()
        ) as client:
            asyncio.get_running_loop().call_later(0.05, cancel.set)
            with pytest.raises(WorkspaceToolError) as caught:
                await client.execute(READ, cancel=cancel)
            return caught.value

    started = time.monotonic()
    error = asyncio.run(main())
    assert time.monotonic() - started < PROMPTLY_S
    assert (error.reason, error.not_started) == ("cancelled", True)
    assert len(runner.script.sent) == 1


def test_cancelling_the_task_closes_the_real_connection(silent_server: SilentServer) -> None:
    async def main() -> None:
        async with AsyncClient(silent_server.url, api_key="k") as client:
            task = asyncio.create_task(client.execute(READ))
            await asyncio.to_thread(silent_server.got_request.wait, 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert silent_server.client_hung_up.wait(PROMPTLY_S)
