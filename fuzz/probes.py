"""Deterministic calls that provoke every answer Sluice can be made to give from outside.

A sample of 200s for each operation (truncated pages, a signal, a command timeout included),
each typed error of the execute endpoint that a client can provoke on a healthy system, the
rate-limit and queue-full 429s, the queue timeout, cancel, and the worker endpoints. Each
`Answer` names the status and code it must have; the caller also judges it with the
`ResponseOracle`. Shared by tests/test_openapi_schema.py and `make fuzz`.

Needs Django set up in this process, on the database the API server uses: it creates
principals and changes the admission policy there (and puts the policy back).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from fuzz.sandbox import LANE, WORKSPACE_ID

EXECUTE = "/v1/workspace-tools/execute"
REGISTER = "/v1/workers/register"
REQUESTS = "/v1/workspace-tools/requests"
WAIT_HEADER = "X-LibreChat-Workspace-Queue-Wait-Ms"
WORKER_HEADER = "X-LibreChat-Code-Worker-ID"
REQUEST_HEADER = "X-LibreChat-Workspace-Request-Id"


@dataclass(frozen=True)
class Live:
    url: str
    api_key: str
    worker_id: str  # a running worker offering WORKSPACE_ID (fuzz/sandbox.py's layout)
    tenant: str


@dataclass(frozen=True)
class Answer:
    label: str
    method: str
    path: str
    status: int  # what it must be
    code: str | None  # the body's code (or "rate_limited" for §3), None: not checked
    response: httpx.Response
    known_bug: str = ""  # the fuzz/known.py bug this probe reproduces until it is fixed

    def mismatch(self) -> str | None:
        got = self.response.status_code
        try:
            body = self.response.json()
        except ValueError:
            body = None
        code = body.get("code", body.get("error")) if isinstance(body, dict) else None
        if got != self.status or (self.code is not None and code != self.code):
            text = self.response.text[:200]
            return f"{self.label}: expected {self.status} {self.code}, got {got} {text!r}"
        return None


def body(operation: str, **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": WORKSPACE_ID, **fields}


def new_api_key(tenant: str, user: str) -> str:
    """A principal of its own (a fresh rate-limit bucket) without touching any worker token."""
    from workspaces.models import ApiKey, Principal, Tenant
    from workspaces.secrets import API_KEY_PREFIX, new_secret

    tenant_row = Tenant.objects.get(name=tenant)
    principal, _ = Principal.objects.get_or_create(tenant=tenant_row, name=user)
    key, prefix, key_hash = new_secret(API_KEY_PREFIX)
    ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash, label="probe")
    return key


@contextmanager
def policy(changes: dict[str, str]) -> Iterator[None]:
    """Change the admission policy for a block, on every API process; put it back after."""
    from admission.policy import policy_row, policy_update

    row = policy_row()
    before = {
        "WORKER_QUEUE_LIMIT": str(row.worker_queue_limit),
        "WORKSPACE_TOOLS_RATE_LIMIT": str(row.rate_limit),
    }
    policy_update(changes)  # live on every API process from its next call (the version bump)
    try:
        yield
    finally:
        policy_update({k: before[k] for k in changes})


@dataclass
class Prober:
    live: Live
    answers: list[Answer] = field(default_factory=list)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8))

    def headers(self, **extra: str) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.live.api_key}", WORKER_HEADER: self.live.worker_id}
        return {**auth, **extra}

    def send(
        self, label: str, status: int, code: str | None, method: str, path: str, **kw: Any
    ) -> httpx.Response:
        known = kw.pop("known_bug", "")
        # A connection per call: a probe that waits must not hold up the others.
        with httpx.Client(base_url=self.live.url, timeout=60) as http:
            response = http.request(method, path, **kw)
        self.answers.append(Answer(label, method, path, status, code, response, known))
        return response

    def execute(
        self, label: str, status: int, code: str | None, payload: Any, **kw: Any
    ) -> httpx.Response:
        """POST execute; `payload` is JSON, or bytes sent as they are (as application/json)."""
        headers = kw.pop("headers", None) or self.headers()
        if isinstance(payload, bytes):
            kw["content"] = payload
            headers = {"Content-Type": "application/json", **headers}
        elif payload is not None:
            kw["json"] = payload
        return self.send(label, status, code, "POST", EXECUTE, headers=headers, **kw)

    def table(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows of (label, status, code, payload[, headers]) sent in order."""
        for label, status, code, payload, *headers in rows:
            self.execute(label, status, code, payload, headers=headers[0] if headers else None)

    def later(self, fn: Callable[[], Any]) -> Future[Any]:
        return self.pool.submit(fn)


def results(p: Prober) -> None:
    """A 200 for every operation, and the result shapes that only some calls produce."""
    name = f"probe/{uuid.uuid4().hex[:8]}.txt"
    edit = [{"oldText": "one", "newText": "uno"}]
    run = "execute_command"
    p.table(
        [
            ("read_file", 200, None, body("read_file", path="README.md")),
            ("read_file truncated", 200, None, body("read_file", path="docs/notes.md", maxLines=2)),
            ("read_file past the end", 200, None, body("read_file", path="README.md", startLine=99)),
            ("read_file an inside link", 200, None, body("read_file", path="inside-link")),
            ("read_file unicode name", 200, None, body("read_file", path="unicode-é ✓.txt")),
            ("read_file in a lane", 200, None, body("read_file", path="README.md", worktree=LANE)),
            ("list_files", 200, None, body("list_files")),
            ("list_files truncated", 200, None, body("list_files", maxResults=1)),
            ("list_files afterPath", 200, None, body("list_files", afterPath="README.md")),
            ("search_text", 200, None, body("search_text", query="hello")),
            ("write_file", 200, None, body("write_file", path=name, content="one two\n")),
            ("write_file again", 200, None, body("write_file", path=name, content="one\n", overwrite=True)),
            ("preview_edit", 200, None, body("preview_edit", path=name, edits=edit)),
            ("edit_file", 200, None, body("edit_file", path=name, edits=edit)),
            ("execute_command", 200, None, body(run, command="echo out; echo err >&2")),
            ("execute_command cwd", 200, None, body(run, command="pwd", cwd="src")),
            ("execute_command exit code", 200, None, body(run, command="exit 3")),
            ("execute_command signal", 200, None, body(run, command="kill -KILL $$")),
            ("execute_command truncated", 200, None, body(run, command="yes | head -c 5000", maxOutputBytes=10)),
            ("execute_command timeout", 200, None, body(run, command="sleep 5", timeoutMs=200)),
        ]
    )  # fmt: skip


def worker_errors(p: Prober) -> None:
    """The worker's typed refusals (contract §2.5's last row), links out of the workspace first."""
    out = [{"oldText": "CANARY", "newText": "x"}]
    missing = [{"oldText": "not in the file", "newText": "x"}]
    big = "head -c 1150000 /dev/zero | tr '\\0' a > big.txt"
    rows: list[tuple[Any, ...]] = [
        (f"read_file {path}", 422, "INVALID_PATH", body("read_file", path=path))
        for path in (
            "escape-file",
            "escape/canary.txt",
            "prefix-escape",
            "docs/up/outside/canary.txt",
        )
    ]
    rows += [
        ("list_files a link out", 422, "INVALID_PATH", body("list_files", path="escape")),
        ("read_file a lane's link out", 422, "INVALID_PATH", body("read_file", path="escape/canary.txt", worktree=LANE)),
        ("search_text a link out", 422, "INVALID_PATH", body("search_text", query="C", path="escape")),
        ("write_file a dangling link", 422, "INVALID_PATH", body("write_file", path="dangling", content="x")),
        ("write_file into a link out", 422, "INVALID_PATH", body("write_file", path="escape/n.txt", content="x")),
        ("write_file .git", 422, "INVALID_PATH", body("write_file", path=".git/hooks/x", content="x")),
        ("edit_file a link out", 422, "INVALID_PATH", body("edit_file", path="escape-file", edits=out)),
        ("execute_command cwd out", 422, "INVALID_PATH", body("execute_command", command="pwd", cwd="escape")),
        ("read_file missing", 422, "NOT_FOUND", body("read_file", path="no/such/file.txt")),
        ("write_file exists", 409, "FILE_EXISTS", body("write_file", path="README.md", content="x")),
        ("edit_file conflict", 409, "EDIT_CONFLICT", body("edit_file", path="README.md", edits=missing)),
        ("make a 1.1 MiB line", 200, None, body("execute_command", command=big)),
        ("read_file over the limit", 422, "READ_LIMIT_EXCEEDED", body("read_file", path="big.txt")),
        ("make a non-UTF-8 file", 200, None, body("execute_command", command="printf '\\377' > b.dat")),
        ("preview_edit non-UTF-8", 422, "INVALID_REQUEST", body("preview_edit", path="b.dat", edits=missing)),
    ]  # fmt: skip
    p.table(rows)
    # Once-reported bugs (now fixed), each on a key of its own: the first one used to quarantine it.
    deep = body("write_file", path="a/" * 1500 + "f", content="x", workspaceInstanceId="d" * 64)
    p.execute(
        "write_file 1,500 segments deep",
        422,
        "INVALID_PATH",
        deep,
    )
    name = body("write_file", path="n" * 256, content="x")
    p.execute("write_file a name over NAME_MAX", 422, "INVALID_PATH", name)


def refusals(p: Prober) -> None:
    """Everything refused before the queue (400, 401, 404, 409, 413, 415, 503)."""
    read = body("read_file", path="README.md")
    rid = {REQUEST_HEADER: uuid.uuid4().hex}
    too_big = b'{"c": "' + b"a" * (5 << 20) + b'"}'
    deep = b"[" * 5000 + b"]" * 5000
    p.table(
        [
            ("no API key", 401, "UNAUTHENTICATED", read, {WORKER_HEADER: p.live.worker_id}),
            ("unknown API key", 401, "UNAUTHENTICATED", read, {"Authorization": "Bearer sk_nope"}),
            ("unknown key in the body", 400, "INVALID_WORKSPACE_TOOL_REQUEST", {**read, "x": 1}),
            ("unsafe path", 400, "INVALID_WORKSPACE_TOOL_REQUEST", {**read, "path": "../outside/canary.txt"}),
            ("queue wait 0", 400, "INVALID_WORKSPACE_QUEUE_WAIT", read, p.headers(**{WAIT_HEADER: "0"})),
            ("queue wait over", 400, "INVALID_WORKSPACE_QUEUE_WAIT", read, p.headers(**{WAIT_HEADER: "300001"})),
            ("worker id malformed", 400, "INVALID_WORKER_ID", read, p.headers(**{WORKER_HEADER: "-x"})),
            ("request id too short", 400, "INVALID_REQUEST_ID", read, p.headers(**{REQUEST_HEADER: "short"})),
            ("request id first use", 200, None, read, p.headers(**rid)),
            ("request id reused", 400, "INVALID_REQUEST_ID", read, p.headers(**rid)),
            ("body not JSON", 400, "INVALID_REQUEST", b"{not json"),
            ("body not UTF-8", 400, "INVALID_REQUEST", b'{"a": "\xff"}'),
            ("body a JSON list", 400, "INVALID_WORKSPACE_TOOL_REQUEST", b"[]"),
            ("body too large", 413, "REQUEST_TOO_LARGE", too_big),
            ("worker unknown", 404, "WORKER_NOT_FOUND", read, p.headers(**{WORKER_HEADER: "no-such"})),
            ("workspace not offered", 409, "WORKER_MISMATCH", {**read, "workspaceId": "not-offered"}),
            ("lane unknown", 409, "WORKER_MISMATCH", {**read, "worktree": "no-such-lane"}),
        ]
    )  # fmt: skip
    text = {**p.headers(), "Content-Type": "text/plain"}
    p.send(
        "body text/plain",
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        "POST",
        EXECUTE,
        content=b"{}",
        headers=text,
    )
    p.execute(
        "operation an object",
        400,
        "INVALID_WORKSPACE_TOOL_REQUEST",
        {**read, "operation": {}},
    )
    p.execute("body nested 5,000 deep", 400, "INVALID_REQUEST", deep)
    _quarantine(p, read)
    _outsider(p, read)


def _quarantine(p: Prober, read: dict[str, Any]) -> None:
    from admission.models import Quarantine
    from admission.services import isolation_key_hash

    # A conversation worktree of its own, so no other call is refused meanwhile.
    request = {**read, "workspaceInstanceId": uuid.uuid4().hex * 2}
    Quarantine.objects.create(
        worker_id=p.live.worker_id,
        workspace_id=WORKSPACE_ID,
        isolation_key_hash=isolation_key_hash(p.live.worker_id, request),
        operation="write_file",
        reason="probe",
    )
    p.execute("quarantined key", 409, "WORKSPACE_QUARANTINED", request)


def _outsider(p: Prober, read: dict[str, Any]) -> None:
    """Another tenant: its worker is "not found" to us; without a default worker it gets 503."""
    from admission.management.commands.bootstrap import bootstrap
    from workspaces.models import Tenant

    tag = uuid.uuid4().hex[:8]
    other = bootstrap(tenant=f"outsider-{tag}", user="outsider", worker_id=f"outsider-{tag}")
    theirs = p.headers(**{WORKER_HEADER: other["worker_id"]})
    p.execute("another tenant's worker", 404, "WORKER_NOT_FOUND", read, headers=theirs)
    Tenant.objects.filter(name=other["tenant"]).update(default_worker=None)
    auth = {"Authorization": f"Bearer {other['api_key']}"}
    p.execute("no worker selected", 503, "NO_WORKER_SELECTED", read, headers=auth)


def waiting(p: Prober) -> None:
    """Queue timeout, and cancel by DELETE of a waiting, a running and a finished call."""
    busy_id, waiter_id = uuid.uuid4().hex, uuid.uuid4().hex
    key = {"workspaceInstanceId": uuid.uuid4().hex * 2}  # a key no other probe uses
    sleep = body("execute_command", command="sleep 1.5", **key)
    read = body("read_file", path="README.md", **key)
    busy_headers = p.headers(**{REQUEST_HEADER: busy_id})
    busy = p.later(lambda: p.execute("busy call", 200, None, sleep, headers=busy_headers))
    time.sleep(0.4)
    short = p.headers(**{WAIT_HEADER: "100"})
    p.execute("queue timeout", 503, "WORKSPACE_QUEUE_TIMEOUT", read, headers=short)
    waiter_headers = p.headers(**{REQUEST_HEADER: waiter_id})
    waiter = p.later(
        lambda: p.execute("cancelled", 409, "REQUEST_CANCELLED", read, headers=waiter_headers)
    )
    time.sleep(0.3)
    auth = {"Authorization": f"Bearer {p.live.api_key}"}

    def delete(label: str, status: int, code: str | None, request_id: str, **kw: Any) -> None:
        path = f"/v1/workspace-tools/requests/{request_id}"
        p.send(label, status, code, "DELETE", path, **{"headers": auth, **kw})

    delete("DELETE a waiting call", 200, None, waiter_id)
    delete("DELETE a running call", 200, None, busy_id)
    waiter.result()
    busy.result()
    delete("DELETE a finished call", 200, None, busy_id)
    delete("DELETE unknown", 404, "REQUEST_NOT_FOUND", uuid.uuid4().hex)
    delete("DELETE malformed", 404, "REQUEST_NOT_FOUND", "bad")
    delete("DELETE no key", 401, "UNAUTHENTICATED", waiter_id, headers={})


def durable(p: Prober) -> None:
    """Durable requests (§2.7): capabilities, submit, status and cancel, and their refusals."""
    auth = {"Authorization": f"Bearer {p.live.api_key}"}
    caps = "/v1/workspace-tools/capabilities"
    p.send("capabilities", 200, None, "GET", caps, headers=auth)
    p.send("capabilities no key", 401, "UNAUTHENTICATED", "GET", caps)
    p.send("capabilities POST", 405, "METHOD_NOT_ALLOWED", "POST", caps, headers=auth)
    key = {"workspaceInstanceId": uuid.uuid4().hex * 2}  # a key no other probe uses
    sleep = body("execute_command", command="sleep 1.5", **key)
    read = body("read_file", path="README.md", **key)
    running, queued = uuid.uuid4().hex, uuid.uuid4().hex

    def submit(label: str, status: int, code: str | None, payload: Any, rid: str = "") -> None:
        headers = p.headers(**({REQUEST_HEADER: rid} if rid else {}))
        p.send(label, status, code, "POST", REQUESTS, json=payload, headers=headers)

    submit("durable submit", 202, None, sleep, running)
    submit("durable submit queued behind it", 202, None, read, queued)
    submit("durable submit again", 202, None, read, queued)
    submit("durable submit without an id", 400, "INVALID_REQUEST_ID", read)
    submit("durable submit a bad id", 400, "INVALID_REQUEST_ID", read, "bad")
    no_path = body("read_file")
    submit(
        "durable submit a bad body",
        400,
        "INVALID_WORKSPACE_TOOL_REQUEST",
        no_path,
        uuid.uuid4().hex,
    )
    p.send("durable submit no key", 401, "UNAUTHENTICATED", "POST", REQUESTS, json=read)
    p.send("durable submit GET", 405, "METHOD_NOT_ALLOWED", "GET", REQUESTS, headers=auth)
    rows: list[tuple[str, int, str | None, str, str, dict[str, Any]]] = [
        ("durable status running", 200, None, "GET", f"{REQUESTS}/{running}", {"headers": auth}),
        ("durable cancel queued", 200, None, "DELETE", f"{REQUESTS}/{queued}", {"headers": auth}),
        ("durable status cancelled", 200, None, "GET", f"{REQUESTS}/{queued}", {"headers": auth}),
        ("durable cancel running", 200, None, "DELETE", f"{REQUESTS}/{running}", {"headers": auth}),
        ("durable status unknown", 404, "REQUEST_NOT_FOUND", "GET", f"{REQUESTS}/{uuid.uuid4().hex}", {"headers": auth}),
        ("durable status malformed", 404, "REQUEST_NOT_FOUND", "GET", f"{REQUESTS}/bad", {"headers": auth}),
        ("durable status no key", 401, "UNAUTHENTICATED", "GET", f"{REQUESTS}/{queued}", {}),
        ("durable status PUT", 405, "METHOD_NOT_ALLOWED", "PUT", f"{REQUESTS}/{queued}", {"headers": auth}),
    ]  # fmt: skip
    for label, status_code, code, method, path, kw in rows:
        p.send(label, status_code, code, method, path, **kw)
    # Leave nothing running behind: the long call ends before the next probe.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with httpx.Client(base_url=p.live.url, timeout=10) as http:
            state = http.get(f"{REQUESTS}/{running}", headers=auth).json().get("state")
        if state not in ("queued", "admitted"):
            break
        time.sleep(0.1)


def limits(p: Prober) -> None:
    """The two 429s: a principal over its rate (§3) and a full worker queue (§2.4).

    One policy change for both (each settle costs a second); each probe calls as a principal
    of its own, with a fresh budget of two units.
    """
    read = body("read_file", path="README.md")

    def as_new_principal(name: str) -> dict[str, str]:
        key = new_api_key(p.live.tenant, f"{name}-{uuid.uuid4().hex[:6]}")
        return {"Authorization": f"Bearer {key}", WORKER_HEADER: p.live.worker_id}

    burst, queue = as_new_principal("burst"), as_new_principal("queue")
    with policy({"WORKSPACE_TOOLS_RATE_LIMIT": "2/30s", "WORKER_QUEUE_LIMIT": "1"}):
        for n in (1, 2):
            p.execute(f"within the rate {n}", 200, None, read, headers=burst)
        p.execute("over the rate", 429, "rate_limited", read, headers=burst)
        sleep = body("execute_command", command="sleep 1")
        held = p.later(lambda: p.execute("holds the queue", 200, None, sleep, headers=queue))
        time.sleep(0.4)
        p.execute("queue full", 429, "WORKER_QUEUE_FULL", read, headers=queue)
        held.result()


def workers(p: Prober, worker_token: str, worker_id: str, *, slow: bool) -> None:
    """The worker endpoints, as a worker that has no runworker behind it; with `slow`, also
    the 504 of a call that a registered worker never answers."""
    auth = {"Authorization": f"Bearer {worker_token}"}
    as_json = {**auth, "Content-Type": "application/json"}
    offer = {"workspaceId": WORKSPACE_ID, "operations": ["read_file", "execute_command"]}
    reg = {"workerId": worker_id, "workspaces": [offer], "slots": 2}
    # First: while the bug stands this registers, and the deregister below must name the
    # incarnation of the last registration.
    lenient = {**reg, "workspaces": [{**offer, "linkedWorktreeLanes": "yes"}]}
    p.send(
        "register a non-boolean", 400, "INVALID_REQUEST", "POST", REGISTER,
        json=lenient, headers=auth,
    )  # fmt: skip
    response = p.send("register", 200, None, "POST", REGISTER, json=reg, headers=auth)
    incarnation = response.json().get("incarnationId", "") if response.is_success else ""
    beat = {"workerId": worker_id, "incarnationId": incarnation}
    rows: list[tuple[str, int, str | None, str, dict[str, Any]]] = [
        ("heartbeat", 200, None, "heartbeat", {"json": beat}),
        ("heartbeat superseded", 409, "WORKER_SUPERSEDED", "heartbeat", {"json": {**beat, "incarnationId": "0" * 32}}),
        ("register another worker", 403, "FORBIDDEN", "register", {"json": {**reg, "workerId": p.live.worker_id}}),
        ("register no token", 401, "UNAUTHENTICATED", "register", {"json": reg, "headers": {}}),
        ("register bad JSON", 400, "INVALID_REQUEST", "register", {"content": b"{", "headers": as_json}),
        ("register text/plain", 415, "UNSUPPORTED_MEDIA_TYPE", "register", {"content": b"{}", "headers": {**auth, "Content-Type": "text/plain"}}),
        ("register unknown key", 400, "INVALID_REQUEST", "register", {"json": {**reg, "x": 1}}),
        ("register nested deep", 400, "INVALID_REQUEST", "register", {"content": b"[" * 5000 + b"]" * 5000, "headers": as_json}),
        ("deregister", 200, None, "deregister", {"json": beat}),
    ]  # fmt: skip
    for label, status, code, action, kw in rows[:-1]:
        p.send(label, status, code, "POST", f"/v1/workers/{action}", **{"headers": auth, **kw})
    if slow:
        # Registered, but no runworker takes its queue: the call is dispatched and never
        # answered. A command's exec budget is its timeout + 5 s, so this takes ~5 s.
        headers = p.headers(**{WORKER_HEADER: worker_id})
        lost = body("execute_command", command="true", timeoutMs=1, workspaceInstanceId="e" * 64)
        p.execute("no worker answers", 504, "ASSIGNMENT_EXPIRED", lost, headers=headers)
    label, status, code, action, kw = rows[-1]
    p.send(label, status, code, "POST", f"/v1/workers/{action}", **{"headers": auth, **kw})
    headers = p.headers(**{WORKER_HEADER: worker_id})
    read = body("read_file", path="README.md")
    p.execute("worker offline", 503, "WORKER_OFFLINE", read, headers=headers)


def bridge(p: Prober) -> None:
    """The bridge routes (§4.5) on an id paired but never redeemed, so nothing runs behind it."""
    auth = {"Authorization": f"Bearer {p.live.api_key}"}
    worker_id = f"fuzz-env-{uuid.uuid4().hex[:12]}"
    pairings, redeem = "/v1/bridge/pairings", "/v1/bridge/pairings/redeem"
    status, revoke = (
        f"/v1/bridge/workers/{worker_id}/status",
        f"/v1/bridge/workers/{worker_id}/revoke",
    )
    rows: list[tuple[str, int, str | None, str, str, dict[str, Any]]] = [
        ("pair", 200, None, "POST", pairings, {"json": {"workerId": worker_id}, "headers": auth}),
        ("pair bad id", 400, "INVALID_WORKER_ID", "POST", pairings, {"json": {"workerId": "a b"}, "headers": auth}),
        ("pair unknown key", 400, "INVALID_REQUEST", "POST", pairings, {"json": {"workerId": worker_id, "x": 1}, "headers": auth}),
        ("pair no key", 401, "UNAUTHENTICATED", "POST", pairings, {"json": {"workerId": worker_id}}),
        ("status while paired", 200, None, "GET", status, {"headers": auth}),
        ("status unknown", 404, "WORKER_NOT_FOUND", "GET", f"/v1/bridge/workers/{uuid.uuid4().hex}/status", {"headers": auth}),
        ("redeem bad code", 400, "INVALID_PAIRING_CODE", "POST", redeem, {"json": {"code": "short"}}),
        ("redeem unknown code", 404, "PAIRING_CODE_UNKNOWN", "POST", redeem, {"json": {"code": "Z" * 32}}),
        ("revoke", 200, None, "POST", revoke, {"headers": auth}),
        ("revoke again", 200, None, "POST", revoke, {"headers": auth}),
    ]  # fmt: skip
    for label, status_code, code, method, path, kw in rows:
        p.send(label, status_code, code, method, path, **kw)


def service(p: Prober) -> None:
    for label, path in (
        ("healthz", "/healthz"),
        ("schema", "/v1/schema/"),
        ("schema docs", "/v1/schema/docs/"),
    ):
        p.send(label, 200, None, "GET", path)
    # Without METRICS_TOKEN or a staff session, from loopback too.
    p.send("metrics without credentials", 401, None, "GET", "/metrics")


def run_all(
    live: Live, *, spare_worker_id: str, spare_token: str, slow: bool = False
) -> list[Answer]:
    """Every probe, in an order that leaves the system as it found it.

    The spare worker must belong to the live tenant and have no runworker behind it.
    """
    prober = Prober(live)
    try:
        for step in (results, worker_errors, refusals, waiting, durable, limits, bridge, service):
            step(prober)
        workers(prober, spare_token, spare_worker_id, slow=slow)
    finally:
        prober.pool.shutdown(wait=True)
    return prober.answers
