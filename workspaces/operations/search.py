"""search_text: a literal, case-sensitive substring search, in pure Python.

Files are visited in ascending path order and lines in file order, so a result (and where it
was cut) is the same on every run over the same tree.
"""

from __future__ import annotations

import os

from sluice_protocol import MATCH_TEXT_MAX_CHARS, cut_utf16, utf16_length

from workspaces.operations.errors import OperationError, check_deadline
from workspaces.operations.paths import iter_tree, open_regular, resolve

# Larger files are skipped: the whole file is held in memory while it is searched.
SEARCH_FILE_MAX_BYTES = 10 * 1024 * 1024
# A NUL among the first bytes marks a binary file, as git and ripgrep decide it.
BINARY_SNIFF_BYTES = 8 * 1024


def _read_text(real: str, rel: str) -> str | None:
    """The file's text, or None when it is binary, too large, or vanished meanwhile."""
    try:
        with open_regular(real, rel) as f:
            if os.fstat(f.fileno()).st_size > SEARCH_FILE_MAX_BYTES:
                return None
            head = f.read(BINARY_SNIFF_BYTES)
            if b"\x00" in head:
                return None
            data = head + f.read(SEARCH_FILE_MAX_BYTES + 1 - len(head))
    except OperationError:
        return None
    if len(data) > SEARCH_FILE_MAX_BYTES:  # grew after the size check
        return None
    return data.decode("utf-8", errors="replace")


def _excerpt(line: str, column: int, query: str) -> str:
    """The line, or when it is longer than MATCH_TEXT_MAX_CHARS UTF-16 units a window of it
    that holds the match: from the line start while the match fits there, else starting a
    little before the match (``column`` still counts from the line start)."""
    start = column - 1
    head = cut_utf16(line, MATCH_TEXT_MAX_CHARS)
    if len(head) >= start + len(query):
        return head
    # Up to a quarter of the room left by the query goes to the text before the match; a
    # query longer than the room starts the window (and is cut with it).
    lead = max(0, (MATCH_TEXT_MAX_CHARS - utf16_length(query)) // 4)
    begin, used = start, 0
    while begin > 0:
        width = 2 if ord(line[begin - 1]) > 0xFFFF else 1
        if used + width > lead:
            break
        begin, used = begin - 1, used + width
    return cut_utf16(line[begin:], MATCH_TEXT_MAX_CHARS)


def _file_matches(text: str, query: str, path: str, limit: int) -> list[dict[str, object]]:
    """Up to ``limit`` matches, one per line: the first occurrence on each line."""
    matches: list[dict[str, object]] = []
    line_no = 1
    counted_to = 0  # newlines before this offset are already counted in line_no
    pos = text.find(query)
    while pos >= 0 and len(matches) < limit:
        line_no += text.count("\n", counted_to, pos)
        line_start = text.rfind("\n", 0, pos) + 1
        line_end = text.find("\n", pos)
        if line_end < 0:
            line_end = len(text)
        line = text[line_start:line_end]
        if line.endswith("\r"):
            line = line[:-1]
        column = pos - line_start + 1
        matches.append(
            {
                "path": path,
                "line": line_no,
                "column": column,
                "text": _excerpt(line, column, query),
            }
        )
        # The query holds no newline (validation refuses CR/LF), so no match spans lines and
        # resuming after this line's newline gives at most one match per line.
        line_no += 1
        counted_to = line_end + 1
        pos = text.find(query, counted_to)
    return matches


def search_text(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    query = str(request["query"])
    rel = str(request.get("path") or "")
    max_results = int(str(request["maxResults"]))
    if not query:
        raise OperationError("INVALID_REQUEST", "query must not be empty.")
    real = resolve(root, rel)
    if os.path.isdir(real):
        files = sorted(iter_tree(root, real, rel, deadline=deadline, timeout_code="SEARCH_TIMEOUT"))
    else:
        # A path naming one file searches that file (open_regular refuses FIFOs and the like).
        open_regular(real, rel).close()
        files = [(rel, real)]
    matches: list[dict[str, object]] = []
    # One match more than asked for tells whether the result was cut.
    for path, file_real in files:
        check_deadline(deadline, "SEARCH_TIMEOUT")
        text = _read_text(file_real, path)
        if text is None or query not in text:
            continue
        matches.extend(_file_matches(text, query, path, max_results + 1 - len(matches)))
        if len(matches) > max_results:
            break
    return {"matches": matches[:max_results], "truncated": len(matches) > max_results}
