"""Bad input at the API edge gets a typed JSON answer: never an HTML page, never a 500.

All against the live API (uvicorn), so what is checked is what a client really receives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.utils import timezone

from workspaces.models import ApiKey, Principal

EXECUTE = "/v1/workspace-tools/execute"
READ = {"protocolVersion": 1, "operation": "read_file", "workspaceId": "repo", "path": "README.md"}
LIMIT_BYTES = 4 * 1024 * 1024


def typed(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "code"}, body
    assert body["code"] == code
    assert isinstance(body["error"], str) and body["error"]


@pytest.fixture
def http(api: Any) -> Iterator[httpx.Client]:
    with api.client() as client:
        yield client


@pytest.fixture
def owner(account_factory: Any) -> Any:
    return account_factory()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "slk_00000000_no-scheme",
        "Bearer two tokens",
        "Bearer slk_00000000_unknown-key",
        "Bearer " + "x" * 300,
        "Bearer \u00e9t\u00e9".encode("latin-1"),
    ],
)
def test_missing_malformed_or_unknown_credentials_get_401_unauthenticated(
    http: httpx.Client, owner: Any, authorization: str | bytes | None
) -> None:
    headers: dict[str, Any] = {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    if authorization is not None:
        headers["Authorization"] = authorization
    typed(http.post(EXECUTE, headers=headers, json=READ), 401, "UNAUTHENTICATED")


def test_a_revoked_key_gets_401_unauthenticated(http: httpx.Client, owner: Any) -> None:
    ApiKey.objects.filter(principal__tenant__name=owner.tenant).update(revoked_at=timezone.now())
    typed(http.post(EXECUTE, headers=owner.auth, json=READ), 401, "UNAUTHENTICATED")


def test_a_key_of_a_deactivated_principal_gets_401_unauthenticated(
    http: httpx.Client, owner: Any
) -> None:
    Principal.objects.filter(tenant__name=owner.tenant).update(is_active=False)
    typed(http.post(EXECUTE, headers=owner.auth, json=READ), 401, "UNAUTHENTICATED")


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"protocolVersion": 1,', b"\xff\xfe\x00"])
def test_a_body_that_is_not_json_gets_400_invalid_request(
    http: httpx.Client, owner: Any, body: bytes
) -> None:
    headers = owner.auth | {
        "Content-Type": "application/json",
        "X-LibreChat-Code-Worker-ID": owner.worker_id,
    }
    typed(http.post(EXECUTE, headers=headers, content=body), 400, "INVALID_REQUEST")


@pytest.mark.parametrize("body", [b"[]", b'"read_file"', b"1", b"null", b'{"protocolVersion": 1}'])
def test_json_that_is_not_a_request_gets_400_invalid_workspace_tool_request(
    http: httpx.Client, owner: Any, body: bytes
) -> None:
    headers = owner.auth | {
        "Content-Type": "application/json",
        "X-LibreChat-Code-Worker-ID": owner.worker_id,
    }
    typed(http.post(EXECUTE, headers=headers, content=body), 400, "INVALID_WORKSPACE_TOOL_REQUEST")


def test_a_body_over_4_mib_gets_413_request_too_large(http: httpx.Client, owner: Any) -> None:
    headers = owner.auth | {
        "Content-Type": "application/json",
        "X-LibreChat-Code-Worker-ID": owner.worker_id,
    }
    typed(
        http.post(EXECUTE, headers=headers, content=b" " * (LIMIT_BYTES + 1)),
        413,
        "REQUEST_TOO_LARGE",
    )


def test_a_chunked_body_over_4_mib_gets_413_request_too_large(
    http: httpx.Client, owner: Any
) -> None:
    # No Content-Length up front: the limit must hold while the body is read, too.
    def chunks() -> Iterator[bytes]:
        for _ in range(5):
            yield b" " * (1024 * 1024)

    headers = owner.auth | {
        "Content-Type": "application/json",
        "X-LibreChat-Code-Worker-ID": owner.worker_id,
    }
    typed(http.post(EXECUTE, headers=headers, content=chunks()), 413, "REQUEST_TOO_LARGE")


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_declared_json_gets_415_unsupported_media_type(
    http: httpx.Client, owner: Any, content_type: str | None
) -> None:
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = http.post(EXECUTE, headers=headers, content=b'{"protocolVersion": 1}')
    typed(response, 415, "UNSUPPORTED_MEDIA_TYPE")


def test_a_get_on_the_execute_endpoint_gets_a_typed_405(http: httpx.Client, owner: Any) -> None:
    typed(http.get(EXECUTE, headers=owner.auth), 405, "METHOD_NOT_ALLOWED")


def test_worker_registration_with_a_bad_token_or_body_gets_typed_answers(
    http: httpx.Client, owner: Any
) -> None:
    register = "/v1/workers/register"
    token = {"Authorization": f"Bearer {owner.worker_token}"}
    typed(
        http.post(register, headers={"Authorization": "Bearer slw_nope"}, json={}),
        401,
        "UNAUTHENTICATED",
    )
    typed(
        http.post(register, headers=token | {"Content-Type": "application/json"}, content=b"{oops"),
        400,
        "INVALID_REQUEST",
    )
    typed(
        http.post(register, headers=token | {"Content-Type": "text/plain"}, content=b"{}"),
        415,
        "UNSUPPORTED_MEDIA_TYPE",
    )
    typed(
        http.post(register, headers=token, json={"workerId": owner.worker_id}),
        400,
        "INVALID_REQUEST",
    )


def test_unknown_api_paths_answer_typed_json_not_html(api):
    with api.client() as http:
        for method, path in (("POST", "/v1/workspace-tools/execute/"), ("GET", "/v1/nothing-here")):
            r = http.request(method, path)
            assert r.status_code == 404
            assert r.headers["Content-Type"].startswith("application/json")
            assert r.json()["code"] == "NOT_FOUND"
