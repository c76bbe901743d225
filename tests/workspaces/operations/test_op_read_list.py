"""read_file windows and list_files pages, on both sides of every bound."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sluice_client.protocol import READ_MAX_BYTES

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
        "content": FIVE_LINES,
        "startLine": 1,
        "endLine": 5,
        "truncated": False,
    }


def test_window_in_the_middle_is_truncated_and_names_the_next_line(
    workspace: Path, run: Run
) -> None:
    (workspace / "a.txt").write_text(FIVE_LINES)
    result = run("read_file", path="a.txt", startLine=2, maxLines=2)
    assert (result["content"], result["endLine"], result["truncated"]) == ("two\nthree\n", 3, True)
    assert result["nextStartLine"] == 4


def test_window_ending_on_the_last_line_is_not_truncated(workspace: Path, run: Run) -> None:
    (workspace / "a.txt").write_text(FIVE_LINES)
    result = run("read_file", path="a.txt", startLine=4, maxLines=2)
    assert (result["content"], result["endLine"], result["truncated"]) == ("four\nfive\n", 5, False)
    assert "nextStartLine" not in result


def test_last_line_without_newline_counts_as_a_line(workspace: Path, run: Run) -> None:
    (workspace / "a.txt").write_text("one\ntwo")
    assert run("read_file", path="a.txt", startLine=1, maxLines=1)["nextStartLine"] == 2
    result = run("read_file", path="a.txt", startLine=2, maxLines=5)
    assert (result["content"], result["endLine"], result["truncated"]) == ("two", 2, False)


@pytest.mark.parametrize("start_line", [6, 7, 1000])
def test_start_line_beyond_the_end_gives_empty_content(
    workspace: Path, run: Run, start_line: int
) -> None:
    (workspace / "a.txt").write_text(FIVE_LINES)
    result = run("read_file", path="a.txt", startLine=start_line, maxLines=3)
    assert (result["content"], result["endLine"], result["truncated"]) == (
        "",
        start_line - 1,
        False,
    )


def test_empty_file_reads_as_no_lines(workspace: Path, run: Run) -> None:
    (workspace / "empty").write_bytes(b"")
    result = run("read_file", path="empty")
    assert (result["content"], result["endLine"], result["truncated"]) == ("", 0, False)


def test_original_line_endings_are_kept_and_bad_utf8_is_replaced(workspace: Path, run: Run) -> None:
    (workspace / "w.txt").write_bytes(b"dos\r\nbad \xff byte\n")
    assert run("read_file", path="w.txt")["content"] == "dos\r\nbad \ufffd byte\n"


def test_window_over_the_read_limit_is_refused_but_a_window_at_the_limit_is_not(
    workspace: Path, run: Run, refuse: Refuse
) -> None:
    exact = b"x" * (READ_MAX_BYTES - 1) + b"\n"
    (workspace / "big.txt").write_bytes(exact + b"y\n")
    assert run("read_file", path="big.txt", maxLines=1)["endLine"] == 1
    assert refuse("read_file", path="big.txt", maxLines=2).code == "READ_LIMIT_EXCEEDED"


def test_a_short_first_line_of_a_2_gib_file_is_read_without_reading_the_rest(
    workspace: Path, run: Run
) -> None:
    with open(workspace / "huge.bin", "wb") as f:
        f.write(b"hello\n")
        f.truncate(2 * 1024**3)  # sparse: costs no disk, but is one 2 GiB line of NULs
    started = time.monotonic()
    result = run("read_file", path="huge.bin", maxLines=1)
    assert (result["content"], result["truncated"]) == ("hello\n", True)
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
