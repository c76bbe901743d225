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


def _window_of(line: str, text: str, column: int, query: str) -> int:
    """Where ``text`` starts in ``line``, after checking it is a slice that holds the match."""
    begin = line.find(text)
    assert begin >= 0, "text is not a slice of the line"
    assert line[column - 1 :].startswith(query), "column is not the match's column in the line"
    assert begin <= column - 1 and column - 1 + len(query) <= begin + len(text)
    return begin


# (line, query, where the match starts in the line)
LONG_LINE_CASES = [
    pytest.param("x" * 3001 + "needle" + "y" * 5000, "needle", 3001, id="match-at-column-3002"),
    pytest.param("\U0001f600" * 1500 + "needle" + "z" * 100, "needle", 1500, id="emoji-before-the-match"),
    pytest.param("a" * 1995 + "needle" + "b" * 3000, "needle", 1995, id="match-crossing-the-2000-cut"),
    pytest.param("c" * 9000 + "needle", "needle", 9000, id="match-at-the-line-end"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "query", "offset"), LONG_LINE_CASES)
def test_a_match_past_the_first_2000_units_gets_a_window_that_holds_it(
    workspace: Path, run: Run, line: str, query: str, offset: int
) -> None:
    _write(workspace, {"long.txt": "short\n" + line + "\n"})
    result = run("search_text", query=query)
    assert search_result_problem({"maxResults": 50}, result) is None
    (match,) = result["matches"]
    assert (match["line"], match["column"]) == (2, offset + 1)
    begin = _window_of(line, match["text"], match["column"], query)
    units = len(match["text"].encode("utf-16-le")) // 2
    assert begin > 0 and units <= MATCH_TEXT_MAX_CHARS
    # Some of the line before the match is kept, and the window is as long as allowed.
    assert begin < offset
    assert units > MATCH_TEXT_MAX_CHARS - 2 or begin + len(match["text"]) == len(line)


def test_a_match_inside_the_first_2000_units_keeps_the_line_start(
    workspace: Path, run: Run
) -> None:
    line = "y" * 1000 + "needle" + "y" * 5000
    _write(workspace, {"a.txt": line + "\n"})
    (match,) = run("search_text", query="needle")["matches"]
    assert (match["column"], match["text"]) == (1001, line[:MATCH_TEXT_MAX_CHARS])


def test_a_query_longer_than_the_window_starts_it(workspace: Path, run: Run) -> None:
    query = "q" * 2500
    line = "p" * 100 + query + "r" * 100
    _write(workspace, {"a.txt": line + "\n"})
    result = run("search_text", query=query)
    assert search_result_problem({"maxResults": 50}, result) is None
    (match,) = result["matches"]
    assert (match["column"], match["text"]) == (101, query[:MATCH_TEXT_MAX_CHARS])
