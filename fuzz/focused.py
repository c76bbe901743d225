"""Focused fuzz (hypothesis) of what schemathesis reaches only by luck: paths, headers, bodies.

Each target draws values from a strategy aimed at one input and knows, independently of the
server, what the answer must be:

* paths      traversal, links out (fuzz/sandbox.py), unicode look-alikes, NUL, long paths, in
             every field that names a path. The document decides valid or not (400), the
             filesystem decides where a valid path lands: outside the workspace -> 422
             INVALID_PATH, never a 200, never the canary's content.
* worker id, request id, queue wait: the contract's pattern and bound decide 400 or not.
* bodies     one field of a valid body replaced by arbitrary JSON: the document and the
             server must agree on valid vs 400 INVALID_WORKSPACE_TOOL_REQUEST.
* raw        JSON the parser finds hard: deep nesting, huge numbers, NaN, BOMs, surrogates.

Every answer is also judged by the ResponseOracle (no 500, JSON errors, inside the schema).
Findings are collected, not raised, so one run explores every target.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from fuzz.known import known_bug, too_long
from fuzz.oracle import ResponseOracle
from fuzz.sandbox import TARGET_PATHS, WORKSPACE_ID

EXECUTE = "/v1/workspace-tools/execute"
REQUESTS = "/v1/workspace-tools/requests"
MUTATING = {"write_file", "edit_file", "execute_command"}
# The contract's own spelling (§2.1), kept apart from the server's code on purpose.
WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")
QUEUE_WAIT_RE = re.compile(r"[1-9][0-9]*")
MAX_FINDINGS_PER_LABEL = 5


@dataclass
class Target:
    url: str
    api_key: str
    worker_id: str
    workspace: Path
    judge: ResponseOracle
    calls: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    findings: list[tuple[str, str]] = field(default_factory=list)
    known: Counter[str] = field(default_factory=Counter)  # bug id -> answers it explains
    dispatched_ids: set[str] = field(default_factory=set)  # request ids a 200 used up
    durable_ids: set[str] = field(default_factory=set)  # request ids a 202 holds
    _per_label: Counter[str] = field(default_factory=Counter)
    _http: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        # One keep-alive connection, as an agent calling in a loop would hold.
        if self._http is None:
            self._http = httpx.Client(base_url=self.url, timeout=60)
        return self._http

    def find(self, label: str, problem: str, response: httpx.Response | None = None) -> None:
        if response is not None:
            request = response.request
            bug = known_bug(request.method, request.url.path, response.status_code, request.content)
            if bug is not None:
                self.known[bug.id] += 1
                return
        self._per_label[label] += 1
        if self._per_label[label] <= MAX_FINDINGS_PER_LABEL:
            self.findings.append((label, problem))

    def post(
        self, label: str, payload: Any, headers: dict[str, Any] | None = None
    ) -> httpx.Response:
        sent: dict[str, Any] = {
            "Authorization": f"Bearer {self.api_key}",
            "X-LibreChat-Code-Worker-ID": self.worker_id,
            "Content-Type": "application/json",
            **(headers or {}),
        }
        content = payload if isinstance(payload, bytes) else _dumps(payload)
        response = self.http.post(EXECUTE, content=content, headers=sent)
        self.calls += 1
        self.statuses[response.status_code] += 1
        for problem in self.judge.problems(
            "POST", EXECUTE, response.status_code, dict(response.headers), response.content
        ):
            self.find(label, f"{problem} (sent {content[:160]!r}, headers {headers})", response)
        return response

    def send(self, label: str, method: str, path: str, **kw: Any) -> httpx.Response:
        """Any other call, with the live key, judged by the document like a POST to execute."""
        headers = {"Authorization": f"Bearer {self.api_key}", **kw.pop("headers", {})}
        response = self.http.request(method, path, headers=headers, **kw)
        self.calls += 1
        self.statuses[response.status_code] += 1
        for problem in self.judge.problems(
            method, path, response.status_code, dict(response.headers), response.content
        ):
            self.find(label, f"{problem} ({method} {path[:160]!r})", response)
        return response

    def expect(
        self, label: str, response: httpx.Response, statuses: set[int], code: str | None, sent: Any
    ) -> None:
        got_code = _code(response)
        if response.status_code not in statuses or (code is not None and got_code != code):
            self.find(
                label,
                f"expected {sorted(statuses)} {code or ''}, got {response.status_code} {got_code} "
                f"for {str(sent)[:200]}",
                response,
            )


def _dumps(value: Any) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, which is what a hostile client sends.
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


def _code(response: httpx.Response) -> str | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data.get("code") if isinstance(data, dict) else None


def _body(operation: str, **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": WORKSPACE_ID, **fields}


# --------------------------------------------------------------------------------------------
# Strategies

_SEGMENTS = st.sampled_from(
    [
        "..", ".", "", "...", "escape", "escape-file", "docs", "up", "src", "outside",
        "canary.txt", "workspace", "workspace2", "secret.txt", ".git", "hooks", "inside-link",
        "dangling", "prefix-escape", "README.md", "%2e%2e", "..%2f", "\\..", "..\\", "~",
        "\u2025", "\uff0e\uff0e", "\u2024\u2024", "e\u0301", "\u00e9", "\u202e", "\u200b",
        "\x00", "\n", "\t", " ", "\ud800", "a" * 255, "a" * 256, "\U0001f600",
    ]
)  # fmt: skip
PATHS = st.one_of(
    st.sampled_from(TARGET_PATHS),
    st.lists(_SEGMENTS | st.text(max_size=10), min_size=1, max_size=8).map("/".join),
    st.lists(_SEGMENTS, min_size=1, max_size=6).map(lambda s: "/" + "/".join(s)),
    st.integers(4090, 4100).map(lambda n: ("docs/" * n)[:n].rstrip("/")),
    st.integers(1, 2100).map(lambda n: "/".join(["a"] * n)),
)
PATH_FIELDS = st.sampled_from(
    [
        ("read_file", "path"), ("list_files", "path"), ("list_files", "afterPath"),
        ("search_text", "path"), ("write_file", "path"), ("preview_edit", "path"),
        ("edit_file", "path"), ("execute_command", "cwd"),
    ]
)  # fmt: skip
# Header bytes h11 lets a client send: visible ASCII, obs-text (0x80-0xff), and space and tab
# inside the value (a server strips them around it, so h11 refuses them there).
_HEADER_BYTES = st.binary(max_size=140).map(
    lambda b: bytes(c for c in b if c in (9, 32) or 33 <= c <= 126 or c >= 128).strip(b" \t")
)
_ODD_IDS = ["", "a" * 128, "a" * 129, "-a", ".a", "_a", "a b", "é", "a\tb", "A" * 16, "A" * 15]
WORKER_IDS = st.one_of(
    st.from_regex(WORKER_ID_RE, fullmatch=True).map(str.encode),
    _HEADER_BYTES,
    st.sampled_from([s.encode("utf-8") for s in _ODD_IDS]),
)
REQUEST_IDS = st.one_of(
    st.from_regex(REQUEST_ID_RE, fullmatch=True).map(str.encode),
    _HEADER_BYTES,
    st.sampled_from([s.encode("utf-8") for s in _ODD_IDS]),
)
_ODD_WAITS = ["", "0", "00", "01", "1", "300000", "300001", "0300000", "1e3", "+5", "-5", "5.0",
              "9" * 30, "5,5", "0x10", "\u0663", "\uff15", "5 5", "1_000", "5\t5"]  # fmt: skip
QUEUE_WAITS = st.one_of(
    st.integers(-5, 400_000).map(lambda n: str(n).encode()),
    st.from_regex(r"[0-9]{1,9}", fullmatch=True).map(str.encode),
    st.text(alphabet="0123456789+-_.eE ", max_size=9).map(lambda s: s.strip().encode()),
    st.sampled_from([s.encode("utf-8") for s in _ODD_WAITS]),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
VALID_BODIES = st.sampled_from(
    [
        _body("read_file", path="README.md", startLine=1, maxLines=5),
        _body("list_files", path="docs", maxResults=3, afterPath="docs/a"),
        _body("search_text", query="hello", path="", maxResults=2),
        _body("write_file", path="fuzz-out/x.txt", content="x", overwrite=True),
        _body("preview_edit", path="README.md", edits=[{"oldText": "hello", "newText": "hi", "replaceAll": False}]),
        _body("edit_file", path="src/app.py", edits=[{"oldText": "hello", "newText": "hello"}], expectedBaseSha256="0" * 64),
        _body("execute_command", command="true", cwd="src", timeoutMs=5000, maxOutputBytes=100),
        # §2.2.1 fields: tolerant matching, and an instruction read the worker may not offer.
        _body("preview_edit", path="README.md", edits=[{"oldText": "hello  ", "newText": "hi"}], matching="tolerant"),
        _body("read_file", path="AGENTS.md", instructionSha256="0" * 64),
    ]
)  # fmt: skip
RAW_BODIES = st.one_of(
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.sampled_from(
        [
            b'{"protocolVersion": 1e400}', b'{"protocolVersion": NaN}', b"\xef\xbb\xbf{}",
            b'{"protocolVersion": ' + b"9" * 5000 + b"}", b'{"path": "\\ud800"}', b"",
            b'{"protocolVersion":1,"operation":"read_file","workspaceId":"fuzz","path":"\\udfff"}',
            b'{"protocolVersion":1,"operation":"read_file","workspaceId":"fuzz","path":"README.md","path":"../x"}',
            b"null", b"1", b'"x"', b"\x00", b"{\x00}",
        ]
    ),
)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Targets


def _lands_outside(workspace: Path, path: str) -> bool:
    real = os.path.realpath(workspace / path)
    root = os.path.realpath(workspace)
    return real != root and not real.startswith(root + "/")


def fuzz_path(t: Target, op_field: tuple[str, str], path: str) -> None:
    operation, name = op_field
    extras: dict[str, dict[str, Any]] = {
        "search_text": {"query": "CANARY"},
        "write_file": {"content": "fuzz\n", "overwrite": True},
        "preview_edit": {"edits": [{"oldText": "CANARY", "newText": "x"}]},
        "edit_file": {"edits": [{"oldText": "fuzz", "newText": "fuzz"}]},
        "execute_command": {"command": "pwd"},
    }
    extra = extras.get(operation, {})
    payload = _body(operation, **extra, **{name: path})
    if name == "afterPath" or (name == "cwd" and operation != "execute_command"):
        payload.setdefault("path", "")
    if operation in MUTATING:
        # A key of its own per call: should a call leave an unknown outcome, the quarantine
        # that follows must not refuse every later call of the run.
        payload["workspaceInstanceId"] = uuid.uuid4().hex * 2
    response = t.post(f"path {operation}.{name}", payload)
    label = f"path {operation}.{name}"
    if not t.judge.request_valid("POST", EXECUTE, payload):
        t.expect(label, response, {400}, "INVALID_WORKSPACE_TOOL_REQUEST", payload)
    elif name != "afterPath" and path and _lands_outside(t.workspace, path):
        t.expect(label + " (lands outside)", response, {422}, "INVALID_PATH", payload)
    elif (
        name != "afterPath"
        and too_long(path, len(os.path.realpath(t.workspace).encode()))
        and response.status_code >= 500
    ):
        # A path no filesystem here can hold: a permanent refusal, never a retryable 503.
        problem = f"answered {response.status_code} {_code(response)}"
        t.find(label + " (too long)", problem, response)


def fuzz_worker_id(t: Target, value: bytes) -> None:
    response = t.post(
        "header worker id",
        _body("read_file", path="README.md"),
        {"X-LibreChat-Code-Worker-ID": value},
    )
    text = value.decode("latin-1").strip(" \t")
    if WORKER_ID_RE.fullmatch(text):
        t.expect("header worker id", response, {200} if text == t.worker_id else {404}, None, value)
    else:
        t.expect("header worker id", response, {400}, "INVALID_WORKER_ID", value)


def fuzz_request_id(t: Target, value: bytes) -> None:
    response = t.post(
        "header request id",
        _body("read_file", path="README.md"),
        {"X-LibreChat-Workspace-Request-Id": value},
    )
    text = value.decode("latin-1").strip(" \t")
    if not REQUEST_ID_RE.fullmatch(text):
        t.expect("header request id", response, {400}, "INVALID_REQUEST_ID", value)
    elif text in t.dispatched_ids or text in t.durable_ids:
        t.expect("header request id reused", response, {400}, "INVALID_REQUEST_ID", value)
    else:
        t.expect("header request id", response, {200}, None, value)
    if response.status_code == 200:
        t.dispatched_ids.add(text)


def fuzz_durable_id(t: Target, value: bytes, method: str) -> None:
    """A durable call's request id (§2.7): the submit header, and the status/cancel path."""
    text = value.decode("latin-1").strip(" \t")
    if method == "POST":
        response = t.send(
            "durable submit id",
            "POST",
            REQUESTS,
            content=_dumps(_body("read_file", path="README.md")),
            headers={
                "Content-Type": "application/json",
                "X-LibreChat-Code-Worker-ID": t.worker_id,
                "X-LibreChat-Workspace-Request-Id": value,
            },
        )
        if not REQUEST_ID_RE.fullmatch(text) or text in t.dispatched_ids:
            # (an id execute used up is bound to a call that is not durable: refused)
            t.expect("durable submit id", response, {400}, "INVALID_REQUEST_ID", value)
        else:
            # A repeat answers its call's status, again 202.
            t.expect("durable submit id", response, {202}, None, value)
            t.durable_ids.add(text)
        return
    # In the path the id is not a header: nothing strips it.
    raw = value.decode("latin-1")
    path = f"{REQUESTS}/{quote(raw, safe='')}"
    response = t.send(f"durable {method} id", method, path)
    if raw in t.durable_ids or (method == "DELETE" and raw in t.dispatched_ids):
        # (DELETE names any call by its id, §2.6; a status exists only for a durable one.)
        t.expect(f"durable {method} id", response, {200}, None, value)
    elif raw in ("", ".", ".."):
        # The client's URL has no id segment left: no route.
        t.expect(f"durable {method} id", response, {404}, None, value)
    else:
        # Unknown, malformed or another call's: the same 404.
        t.expect(f"durable {method} id", response, {404}, "REQUEST_NOT_FOUND", value)


def fuzz_queue_wait(t: Target, value: bytes) -> None:
    response = t.post(
        "header queue wait",
        _body("read_file", path="README.md"),
        {"X-LibreChat-Workspace-Queue-Wait-Ms": value},
    )
    text = value.decode("latin-1").strip(" \t")
    if QUEUE_WAIT_RE.fullmatch(text) and int(text) <= 300_000:
        # A budget of a few ms may pass before the free key is even looked at: a queue timeout.
        allowed = {200, 503} if int(text) < 1000 else {200}
        t.expect("header queue wait", response, allowed, None, value)
        if response.status_code == 503:
            t.expect("header queue wait", response, {503}, "WORKSPACE_QUEUE_TIMEOUT", value)
    else:
        t.expect("header queue wait", response, {400}, "INVALID_WORKSPACE_QUEUE_WAIT", value)


def fuzz_body(t: Target, base: dict[str, Any], key_index: int, value: Any, add: bool) -> None:
    payload = dict(base)
    keys = sorted(payload)
    key = f"x{key_index}" if add else keys[key_index % len(keys)]
    payload[key] = value
    if payload.get("operation") == "execute_command":
        payload["command"] = "true"  # never run generated text
    response = t.post("body field", payload)
    if not _finite(payload):
        # NaN and Infinity are not JSON: the body is not JSON at all.
        t.expect("body field", response, {400}, "INVALID_REQUEST", payload)
    elif t.judge.request_valid("POST", EXECUTE, payload):
        if response.status_code == 400:
            refused = f"{response.text[:200]} for {str(payload)[:300]}"
            t.find(
                "body field", f"the document accepts it, the server refused: {refused}", response
            )
    else:
        t.expect("body field", response, {400}, "INVALID_WORKSPACE_TOOL_REQUEST", payload)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def fuzz_raw(t: Target, raw: bytes) -> None:
    response = t.post("raw body", raw)
    t.expect("raw body", response, {400}, None, raw[:60])


def run(target: Target, *, examples: int, seed: int) -> None:
    """Run every target for `examples` examples each, recording findings on `target`."""
    config = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    targets: list[tuple[Any, dict[str, Any]]] = [
        (fuzz_path, {"op_field": PATH_FIELDS, "path": PATHS}),
        (fuzz_worker_id, {"value": WORKER_IDS}),
        (fuzz_request_id, {"value": REQUEST_IDS}),
        (fuzz_queue_wait, {"value": QUEUE_WAITS}),
        (
            fuzz_durable_id,
            {"value": REQUEST_IDS, "method": st.sampled_from(["POST", "GET", "DELETE"])},
        ),
        (
            fuzz_body,
            {
                "base": VALID_BODIES,
                "key_index": st.integers(0, 20),
                "value": JSON_VALUES,
                "add": st.booleans(),
            },
        ),
        (fuzz_raw, {"raw": RAW_BODIES}),
    ]
    try:
        for fn, strategies in targets:
            hypothesis_seed(seed)(config(given(**strategies)(_bound(fn, target))))()
    finally:
        target.http.close()


def _bound(fn: Any, target: Target) -> Any:
    """`fn` with `target` filled in, as a function hypothesis can decorate (named, no defaults)."""

    def one(**drawn: Any) -> None:
        fn(target, **drawn)

    one.__name__ = fn.__name__
    return one
