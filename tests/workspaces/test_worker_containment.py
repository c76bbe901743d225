"""Path containment end to end (§2.2): a path spelled to escape is refused by the API before
anything is queued; a path that escapes through a symlink inside the workspace reaches the
worker, which resolves it and refuses it (422 INVALID_PATH) before reading or writing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import git_workspace
from workerkit import call, request, ticket_counter

pytestmark = pytest.mark.e2e

SECRET = "TOP-SECRET-OUTSIDE-THE-WORKSPACE"
SPELLED_ESCAPES = [
    "..",
    "../a.txt",
    "src/../../a.txt",
    "/etc/passwd",
    "./a.txt",
    "a//b",
    "src/",
    ".",
    "a\\b",
    "src/./a",
]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text(SECRET + "\n")
    return directory


@pytest.fixture
def repo(tmp_path: Path, outside: Path) -> Path:
    root = git_workspace(tmp_path / "repo", files={"a.txt": "inside\n", "src/b.txt": "b\n"})
    # Links created after the commit: a file link, a directory link and a dangling link, all
    # pointing out of the workspace.
    (root / "leak").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "created-through-link.txt")
    return root


def spelled_escape_requests(path: str) -> list[dict[str, Any]]:
    return [
        request("read_file", path=path),
        request("list_files", path=path),
        request("list_files", afterPath=path),
        request("search_text", query="x", path=path),
        request("write_file", path=path, content="x", overwrite=True),
        request("preview_edit", path=path, edits=[{"oldText": "a", "newText": "b"}]),
        request("edit_file", path=path, edits=[{"oldText": "a", "newText": "b"}]),
        request("execute_command", command="touch escaped-marker", cwd=path),
    ]


def test_paths_spelled_to_escape_are_400_and_never_reach_the_worker(
    http, owner, worker, repo, outside
):
    before = ticket_counter(owner.worker_id)
    failures = []
    for path in SPELLED_ESCAPES:
        for body in spelled_escape_requests(path):
            response = call(http, owner, body)
            if (response.status_code, response.json().get("code")) != (
                400,
                "INVALID_WORKSPACE_TOOL_REQUEST",
            ):
                failures.append((body["operation"], path, response.status_code))
    assert failures == []
    assert ticket_counter(owner.worker_id) == before
    assert not list(repo.rglob("escaped-marker")) and not list(
        outside.parent.rglob("escaped-marker")
    )


# Spelled correctly, but too long for the filesystem (PATH_MAX): only the worker can say so.
LONGEST_PATH = "a/" * 2047 + "bc"


def test_a_4096_char_path_reaches_the_worker_and_4097_does_not(http, owner, worker, repo):
    assert len(LONGEST_PATH) == 4096
    before = ticket_counter(owner.worker_id)
    assert call(http, owner, request("read_file", path=LONGEST_PATH)).status_code != 400
    assert ticket_counter(owner.worker_id) == before + 1
    response = call(http, owner, request("read_file", path=LONGEST_PATH + "d"))
    assert (response.status_code, response.json()["code"]) == (
        400,
        "INVALID_WORKSPACE_TOOL_REQUEST",
    )
    assert ticket_counter(owner.worker_id) == before + 1


def test_a_worker_refusal_of_a_4096_char_path_is_a_typed_422(http, owner, worker, repo):
    response = call(http, owner, request("read_file", path=LONGEST_PATH))
    # Today: 502 RESULT_INVALID, "The worker's error broke the protocol (worker error: error must be
    # at most 4096 characters)"; the client is told the read may have run.
    assert (response.status_code, response.json()["code"]) == (422, "INVALID_PATH")


def refused_by_the_worker(http: httpx.Client, owner: Any, body: dict[str, Any]) -> httpx.Response:
    before = ticket_counter(owner.worker_id)
    response = call(http, owner, body)
    assert ticket_counter(owner.worker_id) == before + 1, (
        "the spelling is fine: the worker must decide"
    )
    assert (response.status_code, response.json()["code"]) == (422, "INVALID_PATH"), response.text
    return response


def test_reads_through_a_symlink_out_of_the_workspace_are_422_and_leak_nothing(
    http, owner, worker, repo, outside
):
    edit = [{"oldText": "TOP", "newText": "x"}]
    bodies = [
        request("read_file", path="leak"),
        request("read_file", path="outdir/secret.txt"),
        request("list_files", path="outdir"),
        request("search_text", query="TOP", path="leak"),
        request("search_text", query="TOP", path="outdir"),
        request("preview_edit", path="leak", edits=edit),
    ]
    for body in bodies:
        response = refused_by_the_worker(http, owner, body)
        assert SECRET not in response.text
        assert str(outside) not in response.text and str(repo) not in response.text

    # A whole-tree listing or search does not follow the links out either.
    listed = call(http, owner, request("list_files")).json()
    assert listed["paths"] == ["a.txt", "src/b.txt"]
    searched = call(http, owner, request("search_text", query="TOP")).json()
    assert searched["matches"] == []


def test_writes_through_a_symlink_out_of_the_workspace_are_422_and_change_nothing(
    http, owner, worker, repo, outside
):
    bodies = [
        request("write_file", path="leak", content="pwned\n", overwrite=True),
        request("write_file", path="outdir/new.txt", content="pwned\n"),
        request("write_file", path="dangling", content="pwned\n"),
        request("edit_file", path="leak", edits=[{"oldText": "TOP", "newText": "pwned"}]),
    ]
    for body in bodies:
        refused_by_the_worker(http, owner, body)
    assert (outside / "secret.txt").read_text() == SECRET + "\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (repo / "leak").is_symlink() and (repo / "dangling").is_symlink()


def test_a_cwd_that_escapes_through_a_symlink_is_422_and_the_command_never_runs(
    http, owner, worker, repo, outside
):
    refused_by_the_worker(
        http, owner, request("execute_command", command="touch ran-outside", cwd="outdir")
    )
    assert not (outside / "ran-outside").exists()
    assert not (repo / "ran-outside").exists()


def test_writes_into_git_metadata_are_422_and_change_nothing(http, owner, worker, repo):
    # A hook or a config change would run code the next time anyone uses git here.
    config = (repo / ".git/config").read_text()
    refused_by_the_worker(
        http, owner, request("write_file", path=".git/hooks/pre-commit", content="#!/bin/sh\n")
    )
    refused_by_the_worker(
        http,
        owner,
        request(
            "edit_file", path=".git/config", edits=[{"oldText": "[core]", "newText": "[core]\n"}]
        ),
    )
    assert not (repo / ".git/hooks/pre-commit").exists()
    assert (repo / ".git/config").read_text() == config
