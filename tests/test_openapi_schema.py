"""The OpenAPI document at /v1/schema/ against docs/api.md, the protocol and a live server.

* It is a valid OpenAPI 3.1 document (the meta-schema schemathesis ships).
* Every (status, code) of docs/api.md's failure table, parsed from the page itself, is a
  documented answer of the execute endpoint; so are its headers (same patterns) and the
  rate-limit headers.
* Its request bodies accept exactly what `sluice_protocol.validate_request` accepts, at
  and around every bound, so client, server and document cannot drift apart.
* Real answers of a live server (uvicorn + a real worker) validate against it: a 200 of every
  operation and each error a client can provoke (fuzz/probes.py, shared with `make fuzz`).
* The bugs `make fuzz` found and that are not fixed yet: xfail(strict=True), one test each.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import sluice_protocol as protocol
from django.conf import settings
from django.test import Client
from livesupport import ApiServer, base_env, start_api
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from api.schema import EXECUTE_PATH, PATTERNS, openapi_document
from fuzz import oracle, probes, sandbox

API_DOC = Path(settings.BASE_DIR) / "docs" / "api.md"
RATE_LIMITED = "(typed rate limit, below)"  # the rate-limit row of the failure table


def api_section(title: str) -> str:
    """A section of docs/api.md, the project's own statement of the API that the schema must
    cover."""
    text = API_DOC.read_text()
    start = re.search(rf"^## {re.escape(title)}$", text, re.MULTILINE)
    assert start is not None, f"docs/api.md has no section {title!r}"
    end = re.compile(r"^## ", re.MULTILINE).search(text, start.end())
    return text[start.end() : end.start() if end else len(text)]


def api_codes() -> list[tuple[int, str]]:
    """(status, code) pairs of the failure table; the rate-limit row as (429, RATE_LIMITED)."""
    pairs: list[tuple[int, str]] = []
    for line in api_section("What a failure means").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.fullmatch(r"[0-9/]+", cells[0]):
            continue
        status, codes = cells[0], cells[1]
        if "/" in status:
            # The worker row names its statuses per group: `A`/`B` 422, `C` 403, ...
            for group, group_status in re.findall(r"((?:`[^`]+`/?)+)\s+([0-9]{3})", codes):
                pairs += [(int(group_status), c) for c in re.findall(r"`([^`]+)`", group)]
        elif "`" in codes:
            pairs += [(int(status), c) for c in re.findall(r"`([A-Z_*]+)`", codes)]
        elif "rate limit" in codes:
            pairs.append((int(status), RATE_LIMITED))
    return pairs


def execute_responses() -> dict[str, Any]:
    return openapi_document()["paths"][EXECUTE_PATH]["post"]["responses"]


def validator(schema: Any) -> jsonschema_rs.Validator:
    document = openapi_document()
    return jsonschema_rs.Draft202012Validator(
        {"components": document["components"], "allOf": [schema]}
    )


# --------------------------------------------------------------------------------------------
# The document itself


def test_the_document_is_valid_openapi_3_1() -> None:
    document = json.loads(json.dumps(openapi_document()))
    errors = [f"{e.instance_path}: {e.message}" for e in OPENAPI_31_VALIDATOR.iter_errors(document)]
    assert errors == []
    assert document["openapi"].startswith("3.1")


def test_every_ref_resolves() -> None:
    text = json.dumps(openapi_document())
    names = set(openapi_document()["components"]["schemas"])
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', text))
    assert refs and refs <= names, refs - names


def test_every_documented_code_is_an_answer_of_the_execute_endpoint() -> None:
    pairs = api_codes()
    # The table holds 20-odd codes; far fewer means the parser, not the schema, is wrong.
    assert len(pairs) >= 25, pairs
    responses = execute_responses()
    missing = []
    for status, code in pairs:
        response = responses.get(str(status))
        if response is None:
            missing.append(f"{status} is not documented")
            continue
        schema = response["content"]["application/json"]["schema"]
        if code == RATE_LIMITED:
            body: dict[str, Any] = {
                "error": "rate_limited",
                "message": "Rate limit exceeded; retry in 3 seconds.",
                "retry_after_seconds": 3,
            }
        else:
            body = {"error": "text", "code": code.replace("*", "COMMAND")}
        if not validator(schema).is_valid(body):
            missing.append(f"{status} {code}")
    assert missing == []


def test_the_documented_headers_are_in_the_schema_with_their_patterns() -> None:
    section = api_section("Headers")
    params = {
        p["name"]: p["schema"]["pattern"]
        for p in openapi_document()["paths"][EXECUTE_PATH]["post"]["parameters"]
    }
    bullets = re.findall(r"^\* `(X-[A-Za-z-]+)[^`]*`(.*?)(?=^\* |\Z)", section, re.M | re.S)
    assert len(bullets) == 3, bullets
    for name, text in bullets:
        assert name in params, name
        pattern = re.search(r"`(\^[^`]+\$)`", text)
        assert pattern is not None, name
        if name == "X-LibreChat-Workspace-Queue-Wait-Ms":
            # docs/api.md gives a pattern and a bound; the schema folds both into its pattern.
            bound = int(re.search(r"≤ ([0-9]+)", text).group(1))  # type: ignore[union-attr]
            for value in [*map(str, range(-2, 1000)), "300000", "300001", "01", "9" * 7, "1e3"]:
                expected = bool(re.fullmatch(pattern.group(1)[1:-1], value)) and int(value) <= bound
                assert bool(re.fullmatch(params[name][1:-1], value)) == expected, value
        else:
            assert params[name] == pattern.group(1), name


def test_the_rate_limit_headers_and_retry_after_are_documented() -> None:
    named = set(
        re.findall(r"`((?:Retry-After|RateLimit-[A-Za-z]+))[`:]", api_section("Rate limit"))
    )
    assert {"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= named
    responses = execute_responses()
    assert named <= set(responses["429"]["headers"])
    assert "Retry-After" in responses["503"]["headers"]  # WORKSPACE_QUEUE_TIMEOUT


def test_the_queue_wait_pattern_accepts_exactly_what_the_protocol_accepts() -> None:
    pattern = re.compile(PATTERNS["queueWaitMs"][1:-1])

    def accepted(value: str) -> bool:
        try:
            protocol.parse_queue_wait_header(value)
        except protocol.ProtocolError:
            return False
        return True

    odd = ["", "0", "00", "01", "+5", "-5", "5.0", "1e3", " 5", "5 ", "٣", "9" * 30, "5_0"]
    for value in [*map(str, range(0, 400_001, 7)), *map(str, range(299_990, 300_011)), *odd]:
        assert bool(pattern.fullmatch(value)) == accepted(value), value


# --------------------------------------------------------------------------------------------
# Request bodies: the document and validate_request agree at and around every bound.

_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 99, 100, 199, 200, 201, 499, 500, 501, 300_000, 300_001,
    1_048_576, 1_048_577, 2**40, 1.5, "", "a", " ", "\t\n", "README.md", "a/b", "../x", "a/..",
    "./x", "a//b", "/a", "a/", "a\\b", "a\x00b", "a\nb", "a\rb", "x.lock", "lane-1", "-lane",
    "é/ü ✓", "0" * 64, "0" * 63, "A" * 64, "a" * 128, "a" * 129, "a" * 4096, "a" * 4097,
    "a" * 32_768, "a" * 32_769, "é" * 16_384, "é" * 16_385, "a" * 1_048_576, "a" * 1_048_577,
    [], [{}], {}, {"oldText": "a", "newText": "b"},
    [{"oldText": "a", "newText": "b"}], [{"oldText": "", "newText": "b"}],
    [{"oldText": "a", "newText": "b", "replaceAll": True}], [{"oldText": "a"}],
    [{"oldText": "a", "newText": "b", "x": 1}], [{"oldText": "a", "newText": "b"}] * 101,
    [{"oldText": "a", "newText": "b"}] * 100,
]  # fmt: skip
_MINIMAL: dict[str, dict[str, Any]] = {
    "read_file": {"path": "a"},
    "list_files": {},
    "search_text": {"query": "q"},
    "write_file": {"path": "a", "content": ""},
    "preview_edit": {"path": "a", "edits": [{"oldText": "a", "newText": "b"}]},
    "edit_file": {"path": "a", "edits": [{"oldText": "a", "newText": "b"}]},
    "execute_command": {"command": "true"},
}


def _document_accepts(check: jsonschema_rs.Validator, body: dict[str, Any], schema: Any) -> bool:
    if not check.is_valid(body):
        return False
    # What JSON Schema cannot say: a bound in UTF-8 bytes (x-maxUtf8Bytes) on a few strings.
    properties = schema["properties"]
    for name, value in body.items():
        limit = properties.get(name, {}).get("x-maxUtf8Bytes")
        if limit is not None and isinstance(value, str) and len(value.encode()) > limit:
            return False
    return True


def _protocol_accepts(body: dict[str, Any]) -> bool:
    try:
        protocol.validate_request(body)
    except protocol.ProtocolError:
        return False
    return True


@pytest.mark.parametrize("operation", sorted(protocol.OPERATIONS))
def test_request_schema_accepts_exactly_what_validate_request_accepts(operation: str) -> None:
    schema = openapi_document()["components"]["schemas"][
        "".join(part.title() for part in operation.split("_")) + "Request"
    ]
    check = validator({"$ref": "#/components/schemas/ExecuteRequest"})
    base = {
        "protocolVersion": 1,
        "operation": operation,
        "workspaceId": "ws",
        **_MINIMAL[operation],
    }
    assert _document_accepts(check, base, schema) and _protocol_accepts(base)
    bodies = [{**base, name: value} for name in schema["properties"] for value in _VALUES]
    bodies += [{k: v for k, v in base.items() if k != name} for name in base]
    bodies += [{**base, "unknown": 1}, {**base, "protocolVersion": 2}]
    disagree = [
        body for body in bodies if _document_accepts(check, body, schema) != _protocol_accepts(body)
    ]
    assert [str(b)[:200] for b in disagree] == []


# --------------------------------------------------------------------------------------------
# The routes and the docs page


@pytest.fixture
def django_client() -> Client:
    return Client()


def test_schema_route_serves_the_document(django_client: Client) -> None:
    response = django_client.get("/v1/schema/")
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(openapi_document()))
    refused = django_client.post("/v1/schema/")
    assert refused.status_code == 405 and refused.json()["code"] == "METHOD_NOT_ALLOWED"
    assert refused["Allow"] == "GET, HEAD"


def test_docs_page_lists_every_endpoint_and_execute_code_without_fetching_anything(
    django_client: Client,
) -> None:
    response = django_client.get("/v1/schema/docs/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    for path in openapi_document()["paths"]:
        assert f"<code>{path}</code>" in page, path
    for status, code in api_codes():
        if code != RATE_LIMITED:
            assert code.replace("*", "") in page, (status, code)
    # Self-contained: no script at all, nothing loaded from another origin.
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)


# --------------------------------------------------------------------------------------------
# A live server: every answer probes provoke validates against the document.


@pytest.mark.e2e
def test_live_answers_validate_against_the_document(
    api: ApiServer, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    owner = account_factory()
    spare = account_factory(tenant=owner.tenant, worker=f"spare-{owner.worker_id}")
    box = sandbox.build(tmp_path / "parent")
    before = oracle.snapshot(box.parent, skip=box.workspace)
    worker_factory(owner, {sandbox.WORKSPACE_ID: box.workspace}, slots=4, lanes=True)
    judge = oracle.ResponseOracle(httpx.get(f"{api.url}/v1/schema/").json(), secrets=box.secrets)

    live = probes.Live(api.url, owner.api_key, owner.worker_id, owner.tenant)
    answers = probes.run_all(live, spare_worker_id=spare.worker_id, spare_token=spare.worker_token)
    problems = []
    for answer in answers:
        if answer.known_bug:
            continue  # each has its own xfail test below
        r = answer.response
        found = [
            answer.mismatch(),
            *judge.problems(answer.method, answer.path, r.status_code, dict(r.headers), r.content),
        ]
        problems += [f"{answer.label}: {p}" for p in found if p]
    assert problems == []
    provoked = {a.response.status_code for a in answers if a.path == EXECUTE_PATH}
    assert {200, 400, 401, 404, 409, 413, 415, 422, 429, 503} <= provoked
    assert oracle.snapshot_changes(before, oracle.snapshot(box.parent, skip=box.workspace)) == []
    assert box.canary.read_text() == f"{box.secret}\n"


# --------------------------------------------------------------------------------------------
# Regression tests for the bugs `make fuzz` found (all fixed). A new one found by the fuzz run
# goes to fuzz/known.py with its probe and gets a strict-xfail test here until it is fixed.


def _post(api: ApiServer, path: str, content: bytes, token: str, **headers: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json", **headers}
    return httpx.post(f"{api.url}{path}", content=content, headers=headers, timeout=30)


def _typed(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    assert response.json()["code"] == code


@pytest.mark.e2e
@pytest.mark.parametrize("action", ["register", "heartbeat", "deregister"])
def test_worker_endpoints_refuse_an_unknown_key_with_400(
    api: ApiServer, account_factory: Any, action: str
) -> None:
    owner = account_factory()
    body = {"workerId": owner.worker_id, "incarnationId": "0" * 32, "x": 1}
    if action == "register":
        body = {
            "workerId": owner.worker_id,
            "workspaces": [{"workspaceId": "w", "operations": ["read_file"]}],
            "slots": 1,
            "x": 1,
        }
    _typed(
        _post(api, f"/v1/workers/{action}", json.dumps(body).encode(), owner.worker_token),
        400,
        "INVALID_REQUEST",
    )


@pytest.mark.e2e
@pytest.mark.parametrize("operation", [{}, [], ["read_file"]])
def test_execute_refuses_an_operation_that_is_not_a_string_with_400(
    api: ApiServer, account_factory: Any, operation: Any
) -> None:
    owner = account_factory()
    body = {"protocolVersion": 1, "operation": operation, "workspaceId": "w", "path": "a"}
    response = _post(api, EXECUTE_PATH, json.dumps(body).encode(), owner.api_key)
    _typed(response, 400, "INVALID_WORKSPACE_TOOL_REQUEST")


@pytest.mark.e2e
@pytest.mark.parametrize("path", [EXECUTE_PATH, "/v1/workers/register"])
def test_deeply_nested_json_is_refused_with_400(
    api: ApiServer, account_factory: Any, path: str
) -> None:
    owner = account_factory()
    token = owner.api_key if path == EXECUTE_PATH else owner.worker_token
    _typed(_post(api, path, b"[" * 5000 + b"]" * 5000, token), 400, "INVALID_REQUEST")


@pytest.mark.e2e
@pytest.mark.parametrize(
    "field",
    [
        {"linkedWorktreeLanes": 0},
        {"linkedWorktreeLanes": "yes"},
        # Found by `make fuzz` (schemathesis, seed 96264): 0 used to register workspace "0".
        {"workspaceId": 0},
        {"workspaceId": 1.5},
    ],
)
def test_worker_register_refuses_what_the_document_forbids(
    api: ApiServer, account_factory: Any, field: dict[str, Any]
) -> None:
    owner = account_factory()
    offer = {"workspaceId": "w", "operations": ["read_file"], **field}
    body = {"workerId": owner.worker_id, "workspaces": [offer], "slots": 1}
    response = _post(api, "/v1/workers/register", json.dumps(body).encode(), owner.worker_token)
    _typed(response, 400, "INVALID_REQUEST")


@pytest.mark.e2e
@pytest.mark.parametrize("action", ["register", "heartbeat", "deregister"])
def test_worker_endpoints_refuse_ids_that_are_not_strings(
    api: ApiServer, account_factory: Any, action: str
) -> None:
    owner = account_factory()
    numeric = int(owner.worker_id) if owner.worker_id.isdigit() else 7
    body: dict[str, Any] = {"workerId": numeric, "incarnationId": "0" * 32}
    if action == "register":
        del body["incarnationId"]
        body |= {"workspaces": [{"workspaceId": "w", "operations": ["read_file"]}], "slots": 1}
    else:
        body = {"workerId": owner.worker_id, "incarnationId": int("1" * 32)}
    response = _post(api, f"/v1/workers/{action}", json.dumps(body).encode(), owner.worker_token)
    _typed(response, 400, "INVALID_REQUEST")


@pytest.mark.e2e
@pytest.mark.parametrize("path", ["/v1/workers/register", "/healthz", "/v1/schema/"])
def test_api_paths_answer_json_even_to_a_disallowed_host(api: ApiServer, path: str) -> None:
    method = "POST" if "workers" in path else "GET"
    response = httpx.request(method, f"{api.url}{path}", headers={"Host": "evil.example"}, json={})
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"


@pytest.mark.e2e
def test_cancel_and_worker_endpoints_answer_typed_503_when_postgres_is_down(
    live_env: dict[str, str],
) -> None:
    server = start_api(base_env({**live_env, "DATABASE_URL": "postgres://root@127.0.0.1:1/none"}))
    try:
        token = {"Authorization": "Bearer sk_any"}
        cancel = httpx.delete(f"{server.url}/v1/workspace-tools/requests/{'a' * 16}", headers=token)
        register = httpx.post(f"{server.url}/v1/workers/register", json={}, headers=token)
    finally:
        server.process.stop()
    for response in (cancel, register):
        _typed(response, 503, "DATABASE_UNAVAILABLE")


@pytest.mark.e2e
def test_execute_405_names_the_allowed_method(api: ApiServer) -> None:
    response = httpx.put(f"{api.url}{EXECUTE_PATH}")
    _typed(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers.get("allow") == "POST"


def _write(root: Path, path: str) -> dict[str, object]:
    from workspaces.operations import run_operation

    request = protocol.validate_request(
        {
            "protocolVersion": 1,
            "operation": "write_file",
            "workspaceId": "w",
            "path": path,
            "content": "x",
        }
    )
    return run_operation(request, root=str(root.resolve()), deadline=time.monotonic() + 5)


@pytest.mark.parametrize("name", ["a" * 256, "d/" + "b" * 300, ("docs/" * 819)[:4090].rstrip("/")])
def test_write_file_of_a_path_too_long_for_the_filesystem_is_an_invalid_path(
    tmp_path: Path, name: str
) -> None:
    from workspaces.operations.errors import OperationError

    with pytest.raises(OperationError) as refused:
        _write(tmp_path, name)
    assert refused.value.code == "INVALID_PATH"


def test_write_file_of_a_deep_path_is_refused_without_an_unknown_outcome(tmp_path: Path) -> None:
    from workspaces.operations.errors import OperationError, OutcomeUnknown

    # Anything but a plain OperationError makes the worker quarantine the workspace's key.
    with pytest.raises(OperationError) as refused:
        _write(tmp_path, "a/" * 1500 + "f")
    assert not isinstance(refused.value, OutcomeUnknown)
    assert refused.value.code == "INVALID_PATH"
