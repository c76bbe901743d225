"""The seven operations end to end: HTTP -> admission -> Celery -> a real `runworker` -> result.

Each test starts its own worker on a temporary git repository and checks the exact key set
and content of what the client gets back, and what changed on disk.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import git_workspace
from workerkit import call, request

pytestmark = pytest.mark.e2e

COMMON = {"protocolVersion", "operation", "workspaceId"}
FILES = {
    "README.md": "# demo\n",
    "notes.txt": "".join(f"line {n}\n" for n in range(1, 6)),
    "src/app.py": "def main():\n    return 'needle'\n",
    "src/util.py": "needle = 1\n",
}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "repo", files=FILES)


def ok(response: httpx.Response, repo: Path) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    # A result names workspace-relative paths only, never where the workspace lives.
    assert str(repo) not in response.text
    body: dict[str, Any] = response.json()
    return body


def test_read_file_returns_a_line_window_with_the_next_start_line(http, owner, worker, repo):
    window = ok(
        call(http, owner, request("read_file", path="notes.txt", startLine=2, maxLines=2)), repo
    )
    assert window == {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "repo",
        "path": "notes.txt",
        "content": "line 2\nline 3",
        "startLine": 2,
        "endLine": 3,
        "truncated": True,
        "nextStartLine": 4,
    }
    rest = ok(call(http, owner, request("read_file", path="notes.txt", startLine=4)), repo)
    # Not truncated: nextStartLine is absent, not null.
    assert set(rest) == COMMON | {"path", "content", "startLine", "endLine", "truncated"}
    assert (rest["content"], rest["startLine"], rest["endLine"], rest["truncated"]) == (
        "line 4\nline 5",
        4,
        5,
        False,
    )


def test_read_file_of_a_missing_file_is_422_not_found(http, owner, worker, repo):
    response = call(http, owner, request("read_file", path="nope.txt"))
    assert response.status_code == 422
    assert response.json()["code"] == "NOT_FOUND"
    assert str(repo) not in response.text


def test_list_files_pages_through_sorted_paths_without_git(http, owner, worker, repo):
    first = ok(call(http, owner, request("list_files", maxResults=2)), repo)
    assert first == {
        "protocolVersion": 1,
        "operation": "list_files",
        "workspaceId": "repo",
        "paths": ["README.md", "notes.txt"],
        "truncated": True,
        "nextAfterPath": "notes.txt",
    }
    second = ok(call(http, owner, request("list_files", maxResults=2, afterPath="notes.txt")), repo)
    assert set(second) == COMMON | {"paths", "truncated"}
    assert (second["paths"], second["truncated"]) == (["src/app.py", "src/util.py"], False)
    inside = ok(call(http, owner, request("list_files", path="src")), repo)
    assert inside["paths"] == ["src/app.py", "src/util.py"]


def test_search_text_finds_literal_matches_with_line_and_column(http, owner, worker, repo):
    found = ok(call(http, owner, request("search_text", query="needle")), repo)
    assert found == {
        "protocolVersion": 1,
        "operation": "search_text",
        "workspaceId": "repo",
        "matches": [
            {"path": "src/app.py", "line": 2, "column": 13, "text": "    return 'needle'"},
            {"path": "src/util.py", "line": 1, "column": 1, "text": "needle = 1"},
        ],
        "truncated": False,
    }
    cut = ok(call(http, owner, request("search_text", query="needle", maxResults=1)), repo)
    assert (len(cut["matches"]), cut["truncated"]) == (1, True)
    # Literal, not a regular expression: "." matches only a dot.
    assert ok(call(http, owner, request("search_text", query="n.edle")), repo)["matches"] == []


def test_write_file_creates_refuses_to_clobber_and_overwrites_on_request(http, owner, worker, repo):
    created = ok(
        call(http, owner, request("write_file", path="new/dir/f.txt", content="héllo\n")), repo
    )
    assert created == {
        "protocolVersion": 1,
        "operation": "write_file",
        "workspaceId": "repo",
        "path": "new/dir/f.txt",
        "created": True,
        "bytesWritten": 7,
    }
    assert (repo / "new/dir/f.txt").read_text() == "héllo\n"

    clobber = call(http, owner, request("write_file", path="new/dir/f.txt", content="other\n"))
    assert (clobber.status_code, clobber.json()["code"]) == (409, "FILE_EXISTS")
    assert (repo / "new/dir/f.txt").read_text() == "héllo\n"

    replaced = ok(
        call(
            http,
            owner,
            request("write_file", path="new/dir/f.txt", content="bye\n", overwrite=True),
        ),
        repo,
    )
    assert (replaced["created"], replaced["bytesWritten"]) == (False, 4)
    assert (repo / "new/dir/f.txt").read_text() == "bye\n"


def test_preview_edit_shows_the_result_and_changes_nothing(http, owner, worker, repo):
    before = (repo / "src/app.py").read_bytes()
    edits = [{"oldText": "needle", "newText": "haystack"}]
    preview = ok(call(http, owner, request("preview_edit", path="src/app.py", edits=edits)), repo)
    expected = "def main():\n    return 'haystack'\n"
    assert preview == {
        "protocolVersion": 1,
        "operation": "preview_edit",
        "workspaceId": "repo",
        "path": "src/app.py",
        "content": expected,
        "hasUtf8Bom": False,
        "baseSha256": hashlib.sha256(before).hexdigest(),
        "replacements": 1,
        "bytesWritten": len(expected.encode()),
    }
    assert (repo / "src/app.py").read_bytes() == before


def test_preview_edit_reports_and_keeps_a_utf8_bom(http, owner, worker, repo):
    (repo / "bom.txt").write_bytes(b"\xef\xbb\xbfa a a\n")
    edits = [{"oldText": "a", "newText": "b", "replaceAll": True}]
    preview = ok(call(http, owner, request("preview_edit", path="bom.txt", edits=edits)), repo)
    assert (
        preview["content"],
        preview["hasUtf8Bom"],
        preview["replacements"],
        preview["bytesWritten"],
    ) == (
        "b b b\n",
        True,
        1,  # edits applied; the three occurrences are in matches (§2.2.1)
        9,
    )
    assert preview["matches"] == [{"strategy": "exact", "occurrences": 3}]


def test_edit_file_applies_edits_only_against_the_expected_base(http, owner, worker, repo):
    base = hashlib.sha256((repo / "src/app.py").read_bytes()).hexdigest()
    stale = call(
        http,
        owner,
        request(
            "edit_file",
            path="src/app.py",
            edits=[{"oldText": "needle", "newText": "pin"}],
            expectedBaseSha256="0" * 64,
        ),
    )
    assert (stale.status_code, stale.json()["code"]) == (409, "EDIT_CONFLICT")
    assert (repo / "src/app.py").read_text() == FILES["src/app.py"]

    edited = ok(
        call(
            http,
            owner,
            request(
                "edit_file",
                path="src/app.py",
                edits=[
                    {"oldText": "needle", "newText": "pin"},
                    {"oldText": "main", "newText": "run"},
                ],
                expectedBaseSha256=base,
            ),
        ),
        repo,
    )
    after = "def run():\n    return 'pin'\n"
    assert edited == {
        "protocolVersion": 1,
        "operation": "edit_file",
        "workspaceId": "repo",
        "path": "src/app.py",
        "replacements": 2,
        "bytesWritten": len(after),
    }
    assert (repo / "src/app.py").read_text() == after

    ambiguous = call(
        http,
        owner,
        request("edit_file", path="notes.txt", edits=[{"oldText": "line", "newText": "row"}]),
    )
    assert (ambiguous.status_code, ambiguous.json()["code"]) == (409, "EDIT_CONFLICT")
    assert (repo / "notes.txt").read_text() == FILES["notes.txt"]


def test_execute_command_runs_in_cwd_and_reports_output_and_exit_code(http, owner, worker, repo):
    ran = ok(
        call(
            http,
            owner,
            request(
                "execute_command",
                command='printf "%s" "${PWD##*/}"; printf oops >&2; exit 3',
                cwd="src",
            ),
        ),
        repo,
    )
    assert ran == {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "repo",
        "exitCode": 3,
        "stdout": "src",
        "stderr": "oops",
        "truncated": False,
        "timedOut": False,
    }
