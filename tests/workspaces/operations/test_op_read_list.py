"""read_file windows and list_files pages, on both sides of every bound."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from librechat_rules import assert_librechat_accepts_read
from sluice_protocol import READ_MAX_BYTES, validate_request, validate_result

from workspaces.operations import OperationError

Run = Callable[..., dict[str, Any]]
Refuse = Callable[..., OperationError]

FIVE_LINES = "one\ntwo\nthree\nfour\nfive\n"


def test_read_file_returns_the_whole_small_file_with_the_common_fields(
    workspace: Path, run: Run
) -> None:
    (workspace / "a.txt").write_text(FIVE_LINES)
    assert run("read_file", path="a.txt") == {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "ws-1",
        "path": "a.txt",
        "content": "one\ntwo\nthree\nfour\nfive",
        "startLine": 1,
        "endLine": 5,
        "truncated": False,
    }


# The window rule of contract §2.2, one row per case: the file's bytes, the window asked for,
# and what must come back (content, endLine, truncated; nextStartLine is endLine + 1 exactly
# when truncated). Every answer is also put through LibreChat's own acceptance rule.
WINDOWS = [
    # (file bytes, startLine, maxLines, content, endLine, truncated)
    pytest.param(b"", 1, 200, "", 0, False, id="empty-file"),
    pytest.param(b"", 3, 200, "", 2, False, id="empty-file-later-start"),
    pytest.param(b"\n", 1, 200, "", 1, False, id="one-empty-line"),
    pytest.param(b"\n\n", 1, 200, "\n", 2, False, id="two-empty-lines"),
    pytest.param(b"\n\nx", 1, 1, "", 1, True, id="empty-line-truncated"),
    pytest.param(b"a", 1, 200, "a", 1, False, id="no-final-newline"),
    pytest.param(b"a\n", 1, 200, "a", 1, False, id="final-newline-is-no-extra-line"),
    pytest.param(b"a\n\n", 1, 200, "a\n", 2, False, id="trailing-empty-line"),
    pytest.param(b"a\n\n", 2, 200, "", 2, False, id="window-on-the-trailing-empty-line"),
    pytest.param(
        b"line one\nline two\nneedle here\n",
        1,
        3,
        "line one\nline two\nneedle here",
        3,
        False,
        id="the-issue-example",
    ),
    pytest.param(FIVE_LINES.encode(), 2, 2, "two\nthree", 3, True, id="middle-window"),
    pytest.param(FIVE_LINES.encode(), 4, 2, "four\nfive", 5, False, id="window-ends-at-eof"),
    pytest.param(FIVE_LINES.encode(), 5, 1, "five", 5, False, id="last-line-exactly"),
    pytest.param(FIVE_LINES.encode(), 6, 3, "", 5, False, id="start-just-past-the-end"),
    pytest.param(FIVE_LINES.encode(), 1000, 3, "", 999, False, id="start-far-past-the-end"),
    pytest.param(b"one\ntwo", 1, 1, "one", 1, True, id="truncated-before-unterminated-line"),
    pytest.param(b"one\ntwo", 2, 5, "two", 2, False, id="unterminated-last-line"),
    pytest.param(b"a\r\nb\r\n", 1, 200, "a\r\nb\r", 2, False, id="crlf-keeps-its-cr"),
    pytest.param(b"a\r\nb\r\n", 2, 200, "b\r", 2, False, id="crlf-second-line"),
    pytest.param(b"a\rb\n", 1, 200, "a\rb", 1, False, id="lone-cr-is-not-a-line-end"),
    pytest.param(b"bad \xff byte\n", 1, 200, "bad \ufffd byte", 1, False, id="bad-utf8-replaced"),
]


@pytest.mark.parametrize(("data", "start", "max_lines", "content", "end", "truncated"), WINDOWS)
def test_read_window_follows_the_contract_and_librechat_accepts_it(
    workspace: Path,
    run: Run,
    data: bytes,
    start: int,
    max_lines: int,
    content: str,
    end: int,
    truncated: bool,
) -> None:
    (workspace / "f.txt").write_bytes(data)
    request = {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "ws-1",
        "path": "f.txt",
        "startLine": start,
        "maxLines": max_lines,
    }
    result = run("read_file", path="f.txt", startLine=start, maxLines=max_lines)
    assert (result["content"], result["endLine"], result["truncated"]) == (content, end, truncated)
    assert result.get("nextStartLine") == (end + 1 if truncated else None)
    assert_librechat_accepts_read(request, result)
    validate_result(validate_request(request), result)


def test_paging_with_next_start_line_reads_every_line_once(workspace: Path, run: Run) -> None:
    text = "".join(f"line {n}\r\n" if n % 3 else f"line {n}\n" for n in range(1, 48)) + "tail"
    (workspace / "f.txt").write_text(text, newline="")
    pieces, start = [], 1
    while True:
        result = run("read_file", path="f.txt", startLine=start, maxLines=10)
        pieces.append(result["content"])
        if not result["truncated"]:
            break
        start = result["nextStartLine"]
    assert "\n".join(pieces) == text


def test_window_stops_truncated_where_the_next_line_would_pass_the_read_limit(
    workspace: Path, run: Run, refuse: Refuse
) -> None:
    exact = b"x" * READ_MAX_BYTES + b"\n"
    (workspace / "big.txt").write_bytes(exact + b"y\n")
    assert run("read_file", path="big.txt", maxLines=1)["endLine"] == 1
    both = run("read_file", path="big.txt", maxLines=2)
    assert (both["endLine"], both["truncated"], both["nextStartLine"]) == (1, True, 2)
    assert len(both["content"].encode()) == READ_MAX_BYTES
    assert run("read_file", path="big.txt", startLine=2)["content"] == "y"
    (workspace / "over.txt").write_bytes(b"x" * (READ_MAX_BYTES + 1) + b"\n")
    assert refuse("read_file", path="over.txt").code == "READ_LIMIT_EXCEEDED"


def test_a_binary_line_is_budgeted_by_its_decoded_size(
    workspace: Path, run: Run, refuse: Refuse
) -> None:
    # 0xff decodes to U+FFFD, three bytes in UTF-8: 400 KiB of it is 1.2 MiB of text.
    (workspace / "bin").write_bytes(b"ok\n" + b"\xff" * (400 * 1024) + b"\n")
    result = run("read_file", path="bin")
    assert (result["content"], result["endLine"], result["truncated"]) == ("ok", 1, True)
    assert refuse("read_file", path="bin", startLine=2).code == "READ_LIMIT_EXCEEDED"


def test_a_short_first_line_of_a_2_gib_file_is_read_without_reading_the_rest(
    workspace: Path, run: Run
) -> None:
    with open(workspace / "huge.bin", "wb") as f:
        f.write(b"hello\n")
        f.truncate(2 * 1024**3)  # sparse: costs no disk, but is one 2 GiB line of NULs
    started = time.monotonic()
    result = run("read_file", path="huge.bin", maxLines=1)
    assert (result["content"], result["truncated"]) == ("hello", True)
    assert time.monotonic() - started < 1


def test_skipping_lines_of_a_huge_file_stops_at_the_deadline(workspace: Path, run: Run) -> None:
    with open(workspace / "huge.bin", "wb") as f:
        f.truncate(2 * 1024**3)
    started = time.monotonic()
    with pytest.raises(OperationError) as caught:
        run("read_file", path="huge.bin", startLine=3, timeout_s=0.2)
    assert caught.value.code == "READ_TIMEOUT"
    assert time.monotonic() - started < 1.5


def test_reading_a_directory_or_a_missing_file_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "dir").mkdir()
    assert refuse("read_file", path="dir").code == "INVALID_PATH"
    assert refuse("read_file", path="missing.txt").code == "NOT_FOUND"
    assert refuse("read_file", path="dir/missing/deeper.txt").code == "NOT_FOUND"


def _tree(root: Path, paths: list[str]) -> None:
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_list_files_sorts_full_paths_by_string_order_not_by_walk_order(
    workspace: Path, run: Run
) -> None:
    # "-" sorts before "/", so a-c precedes a/b although the directory "a" sorts first.
    _tree(workspace, ["a/b", "a-c", "B", "a/z/deep", "_"])
    assert run("list_files")["paths"] == ["B", "_", "a-c", "a/b", "a/z/deep"]


def test_list_files_skips_git_and_the_root_worktrees_but_not_nested_worktrees(
    workspace: Path, run: Run
) -> None:
    _tree(
        workspace,
        [".git/config", ".worktrees/lane/x", "src/.git", "src/.worktrees/kept", "src/main.py"],
    )
    (workspace / "pipe").parent.mkdir(exist_ok=True)
    os.mkfifo(workspace / "pipe")
    assert run("list_files")["paths"] == ["src/.worktrees/kept", "src/main.py"]


def test_list_files_pages_with_after_path(workspace: Path, run: Run) -> None:
    _tree(workspace, ["a", "b", "c", "d", "e"])
    first = run("list_files", maxResults=2)
    assert first["paths"] == ["a", "b"]
    assert (first["truncated"], first["nextAfterPath"]) == (True, "b")
    second = run("list_files", maxResults=2, afterPath="b")
    assert second["paths"] == ["c", "d"]
    last = run("list_files", maxResults=2, afterPath="d")
    assert (last["paths"], last["truncated"]) == (["e"], False)
    assert "nextAfterPath" not in last
    assert run("list_files", maxResults=2, afterPath="e")["paths"] == []


def test_a_page_exactly_as_long_as_the_rest_is_not_truncated(workspace: Path, run: Run) -> None:
    _tree(workspace, ["a", "b"])
    assert run("list_files", maxResults=2)["truncated"] is False


def test_after_path_inside_a_directory_resumes_within_it(workspace: Path, run: Run) -> None:
    _tree(workspace, ["a/1", "a/2", "a/3", "b/1", "c"])
    result = run("list_files", afterPath="a/2")
    assert result["paths"] == ["a/3", "b/1", "c"]


def test_list_files_under_a_subdirectory_returns_workspace_relative_paths(
    workspace: Path, run: Run
) -> None:
    _tree(workspace, ["src/x.py", "src/pkg/y.py", "other.txt"])
    assert run("list_files", path="src")["paths"] == ["src/pkg/y.py", "src/x.py"]


def test_list_files_of_a_file_or_a_missing_directory_is_refused(
    workspace: Path, refuse: Refuse
) -> None:
    _tree(workspace, ["file.txt"])
    assert refuse("list_files", path="file.txt").code == "INVALID_PATH"
    assert refuse("list_files", path="nope").code == "NOT_FOUND"


def test_names_a_client_could_not_send_back_are_left_out_of_listings(
    workspace: Path, run: Run
) -> None:
    # A backslash or a non-UTF-8 name is legal on Linux but not a §2.2 path; one such name in
    # a result would make the API reject the whole page.
    _tree(workspace, ["ok.txt", "back\\slash.txt", "dir\\name/inner.txt"])
    with open(os.fsencode(workspace) + b"/latin\xe9.txt", "wb") as f:
        f.write(b"needle\n")
    (workspace / "ok.txt").write_text("needle\n")
    assert run("list_files")["paths"] == ["ok.txt"]
    assert [m["path"] for m in run("search_text", query="needle")["matches"]] == ["ok.txt"]
