"""search_text: literal, case-sensitive, in path order, one match per line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from librechat_rules import search_result_problem
from sluice_protocol import MATCH_TEXT_MAX_CHARS

from workspaces.operations import OperationError

Run = Callable[..., dict[str, Any]]
Refuse = Callable[..., OperationError]


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / rel).write_bytes(content)
        else:
            (root / rel).write_text(content)


def test_search_reports_path_line_column_and_text(workspace: Path, run: Run) -> None:
    _write(workspace, {"src/app.py": "import os\n\ndef main():\n    os.exit(1)\n"})
    result = run("search_text", query="os.")
    assert result == {
        "protocolVersion": 1,
        "operation": "search_text",
        "workspaceId": "ws-1",
        "matches": [{"path": "src/app.py", "line": 4, "column": 5, "text": "    os.exit(1)"}],
        "truncated": False,
    }


def test_query_is_literal_and_case_sensitive(workspace: Path, run: Run) -> None:
    _write(workspace, {"f.txt": "abc\na.c\nA.C\n"})
    matches = run("search_text", query="a.c")["matches"]
    assert [(m["line"], m["text"]) for m in matches] == [(2, "a.c")]


def test_only_the_first_match_on_a_line_counts_and_column_counts_characters(
    workspace: Path, run: Run
) -> None:
    _write(workspace, {"f.txt": "ééx x x\nnone\nx\n"})
    matches = run("search_text", query="x")["matches"]
    assert [(m["line"], m["column"]) for m in matches] == [(1, 3), (3, 1)]


def test_files_come_in_path_order_and_lines_in_file_order(workspace: Path, run: Run) -> None:
    _write(workspace, {"b.txt": "hit\nhit\n", "a/z.txt": "hit\n", "a-b.txt": "hit\n"})
    matches = run("search_text", query="hit")["matches"]
    assert [(m["path"], m["line"]) for m in matches] == [
        ("a-b.txt", 1),
        ("a/z.txt", 1),
        ("b.txt", 1),
        ("b.txt", 2),
    ]


def test_crlf_is_not_part_of_the_text_and_long_lines_are_cut(workspace: Path, run: Run) -> None:
    long_line = "needle" + "y" * (MATCH_TEXT_MAX_CHARS + 10)
    _write(workspace, {"a.txt": "the needle\r\n", "b.txt": long_line + "\n"})
    texts = [m["text"] for m in run("search_text", query="needle")["matches"]]
    assert texts == ["the needle", long_line[:MATCH_TEXT_MAX_CHARS]]


def test_binary_files_git_worktrees_and_huge_files_are_skipped(workspace: Path, run: Run) -> None:
    _write(
        workspace,
        {
            "bin.dat": b"needle\x00\x01",
            ".git/config": "needle",
            ".worktrees/lane/f": "needle",
            "text.txt": "needle",
        },
    )
    with open(workspace / "huge.txt", "wb") as f:
        f.write(b"needle\n")
        f.truncate(11 * 1024 * 1024)
    assert [m["path"] for m in run("search_text", query="needle")["matches"]] == ["text.txt"]


def test_a_nul_after_the_first_8_kib_does_not_make_a_file_binary(workspace: Path, run: Run) -> None:
    _write(workspace, {"late.dat": b"needle\n" + b"x" * 9000 + b"\x00"})
    assert len(run("search_text", query="needle")["matches"]) == 1


@pytest.mark.parametrize(("hits", "truncated"), [(2, False), (3, True)])
def test_truncated_only_when_a_further_match_exists(
    workspace: Path, run: Run, hits: int, truncated: bool
) -> None:
    # The third hit sits in another file, so the search must look past the first one.
    _write(workspace, {"a.txt": "hit\nhit\n", "b.txt": "hit\n" if hits == 3 else "miss\n"})
    result = run("search_text", query="hit", maxResults=2)
    assert (len(result["matches"]), result["truncated"]) == (2, truncated)


def test_search_under_a_path_or_in_a_single_file(workspace: Path, run: Run) -> None:
    _write(workspace, {"src/a.py": "hit\n", "docs/b.md": "hit\n"})
    assert [m["path"] for m in run("search_text", query="hit", path="src")["matches"]] == [
        "src/a.py"
    ]
    assert [m["path"] for m in run("search_text", query="hit", path="docs/b.md")["matches"]] == [
        "docs/b.md"
    ]


def test_search_of_a_missing_path_is_not_found(workspace: Path, refuse: Refuse) -> None:
    assert refuse("search_text", query="x", path="nope").code == "NOT_FOUND"


def test_search_past_its_deadline_times_out(workspace: Path, run: Run) -> None:
    _write(workspace, {"a.txt": "hit\n"})
    with pytest.raises(OperationError) as caught:
        run("search_text", query="hit", timeout_s=0)
    assert caught.value.code == "SEARCH_TIMEOUT"


def test_a_line_of_emoji_is_cut_by_utf16_units_as_librechat_counts_them(
    workspace: Path, run: Run
) -> None:
    # Each emoji is two UTF-16 units: 2000 units hold 999 of them after "needle " (7 units).
    _write(workspace, {"e.txt": "needle " + "\U0001f600" * 3000 + "\n"})
    result = run("search_text", query="needle")
    assert search_result_problem({"maxResults": 50}, result) is None
    (match,) = result["matches"]
    assert match["text"] == "needle " + "\U0001f600" * 996
    units = len(match["text"].encode("utf-16-le")) // 2
    assert units <= MATCH_TEXT_MAX_CHARS and units > MATCH_TEXT_MAX_CHARS - 2
