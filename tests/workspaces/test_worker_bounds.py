"""Every §2.2 bound end to end, on both sides: the value at the bound runs on a real worker,
the value just past it is 400 and never reaches the worker.

"Never reaches the worker" is proved, not assumed: every call that enters a worker's queue
takes a ticket from the worker's counter in Redis, so a refusal that leaves the counter where
it was was never queued, never dispatched, never run. Where a call would leave a trace on disk
(a marker file, a written file), the trace is checked too.

One worker per test: the cases of a test share it and run one after another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from livesupport import git_workspace
from workerkit import call, request, ticket_counter

pytestmark = pytest.mark.e2e

KIB = 1024
MIB = 1024 * 1024
INVALID = "INVALID_WORKSPACE_TOOL_REQUEST"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(
        tmp_path / "repo",
        files={"a.txt": "".join(f"{n}\n" for n in range(1, 601)), "many.txt": "match\n" * 300},
    )


def padded_command(marker: str, size: int) -> str:
    """A shell command of exactly `size` UTF-8 bytes that creates `marker` when it runs."""
    head = f"touch {marker} #"
    return head + "x" * (size - len(head))


# (case, request) pairs that sit exactly on a bound and must run on the worker: 200.
AT_THE_BOUND: list[tuple[str, dict[str, Any]]] = [
    ("maxLines 500", request("read_file", path="a.txt", maxLines=500)),
    ("maxLines 1", request("read_file", path="a.txt", maxLines=1)),
    ("startLine 1", request("read_file", path="a.txt", startLine=1, maxLines=1)),
    ("list maxResults 500", request("list_files", maxResults=500)),
    ("list maxResults 1", request("list_files", maxResults=1)),
    ("search maxResults 200", request("search_text", query="1", maxResults=200)),
    ("search maxResults 1", request("search_text", query="1", maxResults=1)),
    ("query 4096 chars", request("search_text", query="q" * 4096)),
    ("query 1 char", request("search_text", query="7")),
    # Each oldText occurs exactly once in a.txt ("\n500\n" ... "\n599\n"), so all 100 apply.
    (
        "edits 100",
        request(
            "preview_edit",
            path="a.txt",
            edits=[{"oldText": f"\n{n}\n", "newText": f"\n{n}!\n"} for n in range(500, 600)],
        ),
    ),
    ("timeoutMs 300000", request("execute_command", command="true", timeoutMs=300_000)),
    ("timeoutMs 1", request("execute_command", command="true", timeoutMs=1)),
    ("maxOutputBytes 1 MiB", request("execute_command", command="true", maxOutputBytes=MIB)),
    ("maxOutputBytes 1", request("execute_command", command="true", maxOutputBytes=1)),
]

# (case, request or raw body) that break a bound, a type or the key set: 400, not queued.
PAST_THE_BOUND: list[tuple[str, Any]] = [
    ("maxLines 501", request("read_file", path="a.txt", maxLines=501)),
    ("maxLines 0", request("read_file", path="a.txt", maxLines=0)),
    ("startLine 0", request("read_file", path="a.txt", startLine=0)),
    ("list maxResults 501", request("list_files", maxResults=501)),
    ("list maxResults 0", request("list_files", maxResults=0)),
    ("search maxResults 201", request("search_text", query="1", maxResults=201)),
    ("search maxResults 0", request("search_text", query="1", maxResults=0)),
    ("query 4097 chars", request("search_text", query="q" * 4097)),
    ("query empty", request("search_text", query="")),
    ("query with a newline", request("search_text", query="a\nb")),
    ("query with a CR", request("search_text", query="a\rb")),
    (
        "edits 101",
        request("preview_edit", path="a.txt", edits=[{"oldText": "1", "newText": "2"}] * 101),
    ),
    ("edits 0", request("preview_edit", path="a.txt", edits=[])),
    ("oldText empty", request("edit_file", path="a.txt", edits=[{"oldText": "", "newText": "2"}])),
    (
        "expectedBaseSha256 uppercase",
        request(
            "edit_file",
            path="a.txt",
            edits=[{"oldText": "1", "newText": "2"}],
            expectedBaseSha256="A" * 64,
        ),
    ),
    ("timeoutMs 300001", request("execute_command", command="true", timeoutMs=300_001)),
    ("timeoutMs 0", request("execute_command", command="true", timeoutMs=0)),
    (
        "maxOutputBytes 1 MiB + 1",
        request("execute_command", command="true", maxOutputBytes=MIB + 1),
    ),
    ("maxOutputBytes 0", request("execute_command", command="true", maxOutputBytes=0)),
    ("blank command", request("execute_command", command=" \t ")),
    ("command with NUL", request("execute_command", command="true\x00")),
    ("path 4097 chars", request("read_file", path="a/" * 2048 + "b")),
    ("workspaceId 129 chars", request("read_file", workspace="w" * 129, path="a.txt")),
    ("worktree ending in .lock", request("read_file", path="a.txt", worktree="lane.lock")),
    (
        "workspaceInstanceId not hex",
        request("read_file", path="a.txt", workspaceInstanceId="g" * 64),
    ),
    ("protocolVersion 2", {**request("read_file", path="a.txt"), "protocolVersion": 2}),
    ("unknown operation", request("delete_file", path="a.txt")),
    ("unknown top-level key", request("read_file", path="a.txt", encoding="utf-8")),
    (
        "unknown key in an edit",
        request(
            "preview_edit", path="a.txt", edits=[{"oldText": "1", "newText": "2", "regex": True}]
        ),
    ),
    ("key of another operation", request("read_file", path="a.txt", command="true")),
    ("missing required field", request("read_file")),
    ("maxLines as a string", request("read_file", path="a.txt", maxLines="5")),
    ("maxLines as a float", request("read_file", path="a.txt", maxLines=5.0)),
    ("startLine as a bool", request("read_file", path="a.txt", startLine=True)),
    ("overwrite as a string", request("write_file", path="b.txt", content="x", overwrite="true")),
    ("optional field as null", request("list_files", afterPath=None)),
    (
        "edits not a list",
        request("preview_edit", path="a.txt", edits={"oldText": "1", "newText": "2"}),
    ),
    ("body a list", [request("read_file", path="a.txt")]),
]


def test_values_on_each_bound_run_on_the_worker(http, owner, worker, repo):
    failures = []
    for case, body in AT_THE_BOUND:
        before = ticket_counter(owner.worker_id)
        response = call(http, owner, body)
        if response.status_code != 200 or ticket_counter(owner.worker_id) != before + 1:
            failures.append((case, response.status_code, response.text[:200]))
    assert failures == []
    # At the bound the worker does the whole job, not a cut-down one: 500 of the 600 lines.
    window = call(http, owner, request("read_file", path="a.txt", maxLines=500)).json()
    assert (window["endLine"], window["truncated"], window["nextStartLine"]) == (500, True, 501)
    assert window["content"] == "\n".join(str(n) for n in range(1, 501))
    found = call(http, owner, request("search_text", query="match", maxResults=200)).json()
    assert (len(found["matches"]), found["truncated"]) == (200, True)
    assert found["matches"][-1] == {"path": "many.txt", "line": 200, "column": 1, "text": "match"}


def test_values_past_each_bound_are_400_and_never_reach_the_worker(http, owner, worker, repo):
    failures = []
    before = ticket_counter(owner.worker_id)
    for case, body in PAST_THE_BOUND:
        response = call(http, owner, body)
        if response.status_code != 400 or response.json().get("code") != INVALID:
            failures.append((case, response.status_code, response.text[:200]))
    assert failures == []
    assert ticket_counter(owner.worker_id) == before
    # The worker is there and does run a valid call: the refusals were the API's alone.
    assert call(http, owner, request("read_file", path="a.txt", maxLines=1)).status_code == 200
    assert ticket_counter(owner.worker_id) == before + 1


def test_a_32_kib_command_runs_and_one_byte_more_never_reaches_the_worker(
    http, owner, worker, repo
):
    at_bound = padded_command("ran-32k", 32 * KIB)
    assert len(at_bound.encode()) == 32 * KIB
    assert call(http, owner, request("execute_command", command=at_bound)).json()["exitCode"] == 0
    assert (repo / "ran-32k").exists()

    before = ticket_counter(owner.worker_id)
    too_long = padded_command("ran-32k-plus-1", 32 * KIB + 1)
    response = call(http, owner, request("execute_command", command=too_long))
    assert (response.status_code, response.json()["code"]) == (400, INVALID)
    assert ticket_counter(owner.worker_id) == before
    assert not (repo / "ran-32k-plus-1").exists()


def test_a_32_kib_limit_counts_utf8_bytes_not_characters(http, owner, worker, repo):
    # "é" is two bytes: 16 Ki of them is exactly the limit in bytes, half of it in characters.
    at_bound = "true #" + "é" * ((32 * KIB - 6) // 2)
    assert len(at_bound.encode()) == 32 * KIB
    assert call(http, owner, request("execute_command", command=at_bound)).status_code == 200
    before = ticket_counter(owner.worker_id)
    response = call(http, owner, request("execute_command", command=at_bound + "x"))
    assert (response.status_code, response.json()["code"]) == (400, INVALID)
    assert ticket_counter(owner.worker_id) == before


def test_a_1_mib_write_lands_and_one_byte_more_never_reaches_the_worker(http, owner, worker, repo):
    written = call(http, owner, request("write_file", path="big.txt", content="é" * (MIB // 2)))
    assert written.status_code == 200, written.text
    assert written.json()["bytesWritten"] == MIB
    assert (repo / "big.txt").stat().st_size == MIB

    before = ticket_counter(owner.worker_id)
    response = call(
        http, owner, request("write_file", path="bigger.txt", content="é" * (MIB // 2) + "x")
    )
    assert (response.status_code, response.json()["code"]) == (400, INVALID)
    assert ticket_counter(owner.worker_id) == before
    assert not (repo / "bigger.txt").exists()


def test_queue_wait_header_bounds_are_checked_before_anything_is_queued(http, owner, worker, repo):
    body = request("read_file", path="a.txt", maxLines=1)
    before = ticket_counter(owner.worker_id)
    for value in ("0", "300001", "-1", "1.5", "+5", "05", "abc"):
        response = call(http, owner, body, {"X-LibreChat-Workspace-Queue-Wait-Ms": value})
        assert (value, response.status_code, response.json()["code"]) == (
            value,
            400,
            "INVALID_WORKSPACE_QUEUE_WAIT",
        )
    assert ticket_counter(owner.worker_id) == before
    for value in ("1", "300000"):
        response = call(http, owner, body, {"X-LibreChat-Workspace-Queue-Wait-Ms": value})
        assert (value, response.status_code) == (value, 200)
    assert ticket_counter(owner.worker_id) == before + 2


def test_a_body_that_is_not_json_is_400_invalid_request(http, owner, worker, repo):
    before = ticket_counter(owner.worker_id)
    response = http.post(
        "/v1/workspace-tools/execute",
        headers=owner.auth
        | {"X-LibreChat-Code-Worker-ID": owner.worker_id, "Content-Type": "application/json"},
        content=b'{"protocolVersion": 1,',
    )
    assert (response.status_code, response.json()["code"]) == (400, "INVALID_REQUEST")
    assert ticket_counter(owner.worker_id) == before
