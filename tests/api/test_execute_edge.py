"""The edge's own reading of an execute POST, and a refusal that holds answered there without
Django's request, view or response (api/execute/): in this process, on the real ASGI
application, real Postgres and real Redis."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIRequest
from livesupport import asgi_scope

from admission.completion import CompletionDraft
from admission.policy import policy_update
from api.execute.burst import Arrival
from api.execute.reading import read_at_edge, read_call
from config.asgi import application

EDGE = application.edge

EXECUTE = "/v1/workspace-tools/execute"
BODY = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "repo", "path": "a.txt"}


def _headers(body: bytes, **extra: str) -> list[tuple[bytes, bytes]]:
    pairs = {
        "host": "127.0.0.1:8000",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return [(k.encode(), v.encode()) for k, v in pairs.items()]


def _django_read(scope: dict[str, Any], body: bytes) -> Any:
    request = ASGIRequest(scope, io.BytesIO(body))
    return read_call(request, CompletionDraft())


def test_the_edge_reads_a_call_as_django_does() -> None:
    body = json.dumps(BODY).encode()
    scope = asgi_scope(
        _headers(
            body,
            x_librechat_code_worker_id="w-1",
            x_librechat_workspace_queue_wait_ms="1500",
            x_librechat_workspace_request_id="req-0123456789abcdef",
        )
    )
    edge = read_at_edge(scope, body)
    django = _django_read(scope, body)
    assert edge is not None and edge.parsed is not None and django.parsed is not None
    assert edge.parsed == django.parsed
    assert (edge.parsed.worker_id, edge.parsed.queue_wait_ms) == ("w-1", 1500)
    assert edge.draft.row() | {"uid": "", "started": 0, "request_id": ""} == django.draft.row() | {
        "uid": "",
        "started": 0,
        "request_id": "",
    }


@pytest.mark.parametrize(
    ("body", "content_type", "code"),
    [
        (b"{not json", "application/json", "INVALID_REQUEST"),
        (json.dumps(BODY).encode(), "text/plain", "UNSUPPORTED_MEDIA_TYPE"),
        (json.dumps(BODY | {"extra": 1}).encode(), "application/json", None),
    ],
)
def test_the_edge_refuses_a_bad_call_as_django_does(
    body: bytes, content_type: str, code: str | None
) -> None:
    scope = asgi_scope(_headers(body))
    scope["headers"] = [
        (k, content_type.encode() if k == b"content-type" else v) for k, v in scope["headers"]
    ]
    edge = read_at_edge(scope, body)
    django = _django_read(scope, body)
    assert edge is not None and edge.invalid is not None and django.invalid is not None
    assert (edge.invalid.code, edge.invalid.message) == (
        django.invalid.code,
        django.invalid.message,
    )
    if code is not None:
        assert edge.invalid.code == code


@pytest.mark.parametrize(
    "scope_change",
    [
        # Django folds these into the dashed header it reads: left to Django.
        {"headers": [(b"x-librechat-code-worker_id", b"w-2")]},
        {"headers": [(b"x-librechat-code-worker-id", b"w-2")]},  # given twice
        {"host": b"evil.example"},  # refused by ALLOWED_HOSTS: the middleware answers it
        # DRF renders this one indented, and answers a type it cannot render 406.
        {"headers": [(b"accept", b"application/json; indent=4")]},
        {"headers": [(b"accept", b"text/html")]},
        {"path": "/v1/workspace-tools/requests"},
        {"method": "PUT"},
    ],
)
def test_the_edge_leaves_to_django_what_it_could_read_otherwise(
    scope_change: dict[str, Any],
) -> None:
    body = json.dumps(BODY).encode()
    scope = asgi_scope(
        _headers(body, x_librechat_code_worker_id="w-1"),
        path=scope_change.get("path", EXECUTE),
        method=scope_change.get("method", "POST"),
    )
    scope["headers"] += scope_change.get("headers", [])
    if "host" in scope_change:
        scope["headers"] = [
            (k, scope_change["host"] if k == b"host" else v) for k, v in scope["headers"]
        ]
    assert read_at_edge(scope, body) is None


async def _call(
    headers: list[tuple[bytes, bytes]], body: bytes, gone: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """One POST through the real ASGI application: the messages it sent. The client stays
    until its answer, or until `gone` is set: then it goes away."""
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        if gone is None:
            await asyncio.sleep(3600)
            raise AssertionError
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await application(asgi_scope(headers, path=EXECUTE), receive, send)
    return sent


@pytest.fixture(autouse=True)
def _own_redis_namespace(settings: Any, redis_prefix: str, sync_redis: Any) -> None:
    """This test's keys, completion stream included, under a prefix of its own (removed after
    it): the session's drainer, which lands the session prefix's stream, would otherwise land
    these rows in Postgres during a later test of this process."""
    settings.REDIS_KEY_PREFIX = redis_prefix


def _calls(
    headers: list[tuple[bytes, bytes]], body: bytes, n: int, caplog: pytest.LogCaptureFixture
) -> tuple[list[list[dict[str, Any]]], int, list[dict[str, Any]]]:
    """`n` POSTs one after another: the messages each got, how many reached Django's handler
    (the view), and the completion rows written (from their log lines)."""
    viewed: list[int] = []
    run_view = EDGE.run_get_response

    async def counting(request: Any) -> Any:
        viewed.append(1)
        return await run_view(request)

    async def scenario() -> list[list[dict[str, Any]]]:
        answers = [await _call(headers, body) for _ in range(n)]
        await EDGE.emissions.flush()
        return answers

    caplog.set_level(logging.INFO, logger="sluice.completion")
    EDGE.run_get_response = counting  # type: ignore[method-assign]
    try:
        answers = asyncio.run(scenario())
    finally:
        del EDGE.run_get_response
    fields = CompletionDraft().row().keys()
    rows = [
        {k: v for k, v in r.__dict__.items() if k in fields}
        for r in caplog.records
        if r.msg == "Workspace tool request completed"
    ]
    return answers, len(viewed), rows


def _without(row: dict[str, Any], varying: set[str]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in varying}


def test_a_refusal_held_in_memory_is_answered_at_the_edge_word_for_word(
    transactional_db: None, account_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    owner = account_factory()
    policy_update({"WORKSPACE_TOOLS_RATE_LIMIT": "1/30s"})
    body = json.dumps(BODY).encode()
    headers = _headers(
        body, authorization=f"Bearer {owner.api_key}", x_librechat_code_worker_id=owner.worker_id
    )
    (_, second, third), viewed, rows = _calls(headers, body, 3, caplog)
    # The first call took the one unit; the second was refused by the view, and that refusal
    # holds; the edge repeated it to the third: the view was not asked again.
    assert second[0]["status"] == 429
    assert json.loads(second[1]["body"])["error"] == "rate_limited"
    assert viewed == 2
    assert third == second  # status, every header and the body, as the view sent them
    assert len(rows) == 3
    varying = {"uid", "started", "request_id", "duration_ms"}
    assert _without(rows[1], varying) == _without(rows[2], varying)
    assert rows[2]["principal_hash"] and rows[2]["code"] == "RATE_LIMITED"


def test_an_overloaded_call_is_answered_at_the_edge_as_the_view_answers_it(
    transactional_db: None,
    account_factory: Any,
    caplog: pytest.LogCaptureFixture,
    settings: Any,
) -> None:
    """From the first overloaded call on, with nothing learned from the view: in a burst, every
    call read before the view had answered one went through it. A call the edge leaves to
    Django (a header name with an underscore) gets the view's answer; the edge's is the same
    word for word, and so is the row."""
    owner = account_factory()
    settings.SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY = 0  # every call is past its key's share
    body = json.dumps(BODY).encode()
    headers = _headers(
        body,
        authorization=f"Bearer {owner.api_key}",
        x_librechat_code_worker_id=owner.worker_id,
        x_librechat_workspace_request_id="req-0123456789abcdef",
    )
    (at_edge, _), viewed_at_edge, edge_rows = _calls(headers, body, 2, caplog)
    assert viewed_at_edge == 0  # neither reached Django's request or the view
    caplog.clear()
    (by_view,), viewed, view_rows = _calls([*headers, (b"x-left_to_django", b"1")], body, 1, caplog)
    assert viewed == 1
    assert by_view[0]["status"] == 503
    assert json.loads(by_view[1]["body"])["code"] == "SERVICE_OVERLOADED"
    assert at_edge == by_view  # word for word, Connection: close and Retry-After included
    varying = {"uid", "started", "duration_ms"}
    assert len(edge_rows) == 2 and len(view_rows) == 1
    assert _without(edge_rows[0], varying) == _without(view_rows[0], varying)
    assert edge_rows[0]["worker_id"] == owner.worker_id
    assert edge_rows[0]["request_id"] == "req-0123456789abcdef"


@pytest.mark.parametrize(("limit_read_s_ago", "together"), [(0, False), (10, False), (0, True)])
def test_calls_beyond_their_queue_limit_are_refused_before_those_ahead_have_entered(
    transactional_db: None,
    account_factory: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    limit_read_s_ago: int,
    together: bool,
) -> None:
    """A burst's calls past its worker's queue limit get their 429 WORKER_QUEUE_FULL at once,
    while the calls ahead of them still wait for their turn to enter (here: their queue script
    held back); those ahead are not refused by it. With the limit read just now (by the first
    call ahead) the edge answers them all, with no view, also when they arrive together with
    the calls ahead (all read before any is counted in flight). With the limit read 10 s
    ago, one view reads the policy again and refuses its
    call, and the others get the edge's answer, word for word the view's."""
    from django.test import Client

    from admission import connections
    from admission.queue import AsyncQueue

    # The registration below makes this process's sync queue: under this test's prefix, and
    # forgotten after it (later tests' revocations would mark keys under this prefix).
    monkeypatch.setattr(connections, "_sync", None)
    owner = account_factory()
    policy_update({"WORKER_QUEUE_LIMIT": "3"})
    settings.SLUICE_ADMITTING_PER_KEY = 1  # the calls ahead go through admission one by one
    registered = Client().post(
        "/v1/workers/register",
        {
            "workerId": owner.worker_id,
            "workspaces": [{"workspaceId": "repo", "operations": ["read_file"]}],
            "slots": 1,
        },
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {owner.worker_token}",
    )
    assert registered.status_code == 200, registered.content
    body = json.dumps(BODY).encode()
    headers = _headers(
        body, authorization=f"Bearer {owner.api_key}", x_librechat_code_worker_id=owner.worker_id
    )
    entering: list[str] = []
    real_enter = AsyncQueue.enter
    viewed: list[int] = []
    run_view = EDGE.run_get_response

    async def counting(request: Any) -> Any:
        viewed.append(1)
        return await run_view(request)

    # The calls that went on past the edge although beyond the limit (to be refused later).
    went_on_beyond: list[int] = []
    real_through = EDGE.burst.through

    async def through(arrival: Arrival, *args: Any) -> Any:
        if arrival.beyond:
            went_on_beyond.append(arrival.ahead)
        return await real_through(arrival, *args)

    monkeypatch.setattr(EDGE.burst, "through", through)

    async def scenario() -> tuple[list[list[dict[str, Any]]], int, int]:
        let_in, gone, one_more = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def held_enter(self: AsyncQueue, **kw: Any) -> Any:
            entering.append(kw["entry_id"])
            one_more.set()
            await let_in.wait()
            return await real_enter(self, **kw)

        monkeypatch.setattr(AsyncQueue, "enter", held_enter)

        def call() -> Any:
            return _call(headers, body, gone)

        async def entries(n: int) -> None:
            while len(entering) < n:
                one_more.clear()
                await one_more.wait()

        # The first call reads the policy (the queue limit) and waits at its enter.
        first = asyncio.create_task(call())
        await asyncio.wait_for(entries(1), 30)
        ahead = [first] + [asyncio.create_task(call()) for _ in range(2)]
        if not together:
            await asyncio.sleep(0)
        views_ahead = len(viewed)
        if limit_read_s_ago:
            # The clock of the calls in flight moves on: the limit read by the first call is that old now.
            now = EDGE.burst.in_flight.now
            monkeypatch.setattr(EDGE.burst.in_flight, "now", lambda: now() + limit_read_s_ago)
        # Three of the credential's calls in flight (or on their way, `together`): the next
        # five are beyond the limit.
        beyond = await asyncio.wait_for(asyncio.gather(*(call() for _ in range(5))), 30)
        entered_meanwhile = len(entering)
        viewed_for_beyond = len(viewed) - views_ahead
        let_in.set()
        # The calls ahead enter (one granted, two waiting): not refused by what the others got.
        await asyncio.wait_for(entries(3), 30)
        gone.set()
        await asyncio.wait_for(asyncio.gather(*ahead), 30)
        await EDGE.emissions.flush()
        assert EDGE.burst.in_flight.in_flight == {}  # every call counted was counted out
        return beyond, entered_meanwhile, viewed_for_beyond

    caplog.set_level(logging.INFO, logger="sluice.completion")
    EDGE.run_get_response = counting  # type: ignore[method-assign]
    try:
        beyond, entered_meanwhile, viewed_for_beyond = asyncio.run(scenario())
    finally:
        del EDGE.run_get_response
    assert entered_meanwhile == 1  # refused while the calls ahead had not entered
    # Fresh: none reached the view; stale: one view, the other four answered at the edge.
    assert viewed_for_beyond == (1 if limit_read_s_ago else 0)
    # Fresh: each refused as it was read, counting the calls ahead read before it, even those
    # whose tasks had not run yet (`together`); stale: all five wait for the policy's read,
    # each counting the calls read before it.
    assert went_on_beyond == ([3, 4, 5, 6, 7] if limit_read_s_ago else [])
    assert all(sent[0]["status"] == 429 for sent in beyond)
    assert all(json.loads(sent[1]["body"])["code"] == "WORKER_QUEUE_FULL" for sent in beyond)
    assert all(sent == beyond[0] for sent in beyond[1:])
    rows = [r for r in caplog.records if r.msg == "Workspace tool request completed"]
    codes = sorted(str(getattr(r, "code", "")) for r in rows)
    assert codes.count("WORKER_QUEUE_FULL") == 5
    assert "WORKER_QUEUE_FULL" not in {getattr(r, "code", "") for r in rows[-3:]}
