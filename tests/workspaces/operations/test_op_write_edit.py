"""write_file, preview_edit and edit_file on real files."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workspaces.operations import OperationError

Run = Callable[..., dict[str, Any]]
Refuse = Callable[..., OperationError]

BOM = b"\xef\xbb\xbf"


def _no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob("*") if p.name.endswith(".sluice-tmp")]


def test_write_creates_the_file_and_its_parents(workspace: Path, run: Run) -> None:
    result = run("write_file", path="new/deep/file.txt", content="héllo\n")
    assert result == {
        "protocolVersion": 1,
        "operation": "write_file",
        "workspaceId": "ws-1",
        "path": "new/deep/file.txt",
        "created": True,
        "bytesWritten": 7,
    }
    assert (workspace / "new/deep/file.txt").read_text() == "héllo\n"
    assert _no_temp_files(workspace)


def test_write_without_overwrite_keeps_an_existing_file(workspace: Path, refuse: Refuse) -> None:
    (workspace / "a.txt").write_text("old")
    assert refuse("write_file", path="a.txt", content="new").code == "FILE_EXISTS"
    assert (workspace / "a.txt").read_text() == "old"
    assert _no_temp_files(workspace)


def test_overwrite_replaces_the_content_and_keeps_the_mode(workspace: Path, run: Run) -> None:
    target = workspace / "run.sh"
    target.write_text("old")
    target.chmod(0o751)
    result = run("write_file", path="run.sh", content="#!/bin/sh\n", overwrite=True)
    assert (result["created"], result["bytesWritten"]) == (False, 10)
    assert target.read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751


def test_new_files_get_the_umask_mode_not_the_temp_files_0600(workspace: Path, run: Run) -> None:
    run("write_file", path="f.txt", content="x")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((workspace / "f.txt").stat().st_mode) == 0o666 & ~umask


def test_overwrite_of_a_missing_file_creates_it(workspace: Path, run: Run) -> None:
    assert run("write_file", path="f.txt", content="", overwrite=True)["created"] is True
    assert (workspace / "f.txt").read_bytes() == b""


def test_write_onto_a_directory_or_under_a_file_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "dir").mkdir()
    (workspace / "file").write_text("x")
    assert refuse("write_file", path="dir", content="x", overwrite=True).code == "INVALID_PATH"
    assert refuse("write_file", path="file/child.txt", content="x").code == "INVALID_PATH"
    assert (workspace / "file").read_text() == "x"


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/pre-commit", "sub/.git/HEAD"])
def test_writes_and_edits_inside_git_are_refused(
    workspace: Path, refuse: Refuse, path: str
) -> None:
    (workspace / path).parent.mkdir(parents=True)
    (workspace / path).write_text("[core]\n")
    assert refuse("write_file", path=path, content="x", overwrite=True).code == "INVALID_PATH"
    edits = [{"oldText": "core", "newText": "evil"}]
    assert refuse("edit_file", path=path, edits=edits).code == "INVALID_PATH"
    assert (workspace / path).read_text() == "[core]\n"


def test_a_symlink_into_git_does_not_open_a_way_to_write_there(
    workspace: Path, refuse: Refuse
) -> None:
    (workspace / ".git").mkdir()
    (workspace / ".git/config").write_text("[core]\n")
    (workspace / "cfg").symlink_to(".git/config")
    assert refuse("write_file", path="cfg", content="x", overwrite=True).code == "INVALID_PATH"
    assert (workspace / ".git/config").read_text() == "[core]\n"


def test_preview_returns_the_new_content_and_writes_nothing(workspace: Path, run: Run) -> None:
    raw = b"a = 1\nb = 2\n"
    (workspace / "c.py").write_bytes(raw)
    result = run("preview_edit", path="c.py", edits=[{"oldText": "b = 2", "newText": "b = 3"}])
    assert result == {
        "protocolVersion": 1,
        "operation": "preview_edit",
        "workspaceId": "ws-1",
        "path": "c.py",
        "content": "a = 1\nb = 3\n",
        "hasUtf8Bom": False,
        "baseSha256": hashlib.sha256(raw).hexdigest(),
        "replacements": 1,
        "bytesWritten": 12,
    }
    assert (workspace / "c.py").read_bytes() == raw


def test_bom_is_stripped_for_matching_and_written_back(workspace: Path, run: Run) -> None:
    raw = BOM + b"title\r\nbody\r\n"
    (workspace / "b.txt").write_bytes(raw)
    edits = [{"oldText": "title", "newText": "Title"}]
    preview = run("preview_edit", path="b.txt", edits=edits)
    assert (preview["content"], preview["hasUtf8Bom"], preview["bytesWritten"]) == (
        "Title\r\nbody\r\n",
        True,
        16,
    )
    assert preview["baseSha256"] == hashlib.sha256(raw).hexdigest()
    result = run("edit_file", path="b.txt", edits=edits)
    assert result == {
        "protocolVersion": 1,
        "operation": "edit_file",
        "workspaceId": "ws-1",
        "path": "b.txt",
        "replacements": 1,
        "bytesWritten": 16,
    }
    assert (workspace / "b.txt").read_bytes() == BOM + b"Title\r\nbody\r\n"


def test_edits_apply_in_order_and_replace_all_counts_every_occurrence(
    workspace: Path, run: Run
) -> None:
    (workspace / "f.txt").write_text("x x x\ny\n")
    edits = [
        {"oldText": "x", "newText": "y", "replaceAll": True},
        {"oldText": "y y y", "newText": "done"},
    ]
    result = run("edit_file", path="f.txt", edits=edits)
    # replacements counts edits applied; the occurrences are in matches (§2.2.1).
    assert result["replacements"] == 2
    assert result["matches"] == [
        {"strategy": "exact", "occurrences": 3},
        {"strategy": "exact", "occurrences": 1},
    ]
    assert (workspace / "f.txt").read_text() == "done\ny\n"


def test_edit_keeps_the_file_mode(workspace: Path, run: Run) -> None:
    (workspace / "run.sh").write_text("echo a\n")
    (workspace / "run.sh").chmod(0o700)
    run("edit_file", path="run.sh", edits=[{"oldText": "a", "newText": "b"}])
    assert stat.S_IMODE((workspace / "run.sh").stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "edits",
    [
        [{"oldText": "missing", "newText": "x"}],
        [{"oldText": "dup", "newText": "x"}],
        [{"oldText": "dup", "newText": "x", "replaceAll": False}],
        [{"oldText": "one", "newText": "two"}, {"oldText": "one", "newText": "three"}],
        [{"oldText": "one\n", "newText": "x"}],  # bare \n does not match the file's \r\n
    ],
    ids=["not-found", "ambiguous", "ambiguous-explicit", "gone-after-earlier-edit", "line-ending"],
)
def test_edit_conflicts_leave_the_file_untouched(
    workspace: Path, refuse: Refuse, edits: list[dict[str, object]]
) -> None:
    raw = b"one\r\ndup dup\r\n"
    (workspace / "f.txt").write_bytes(raw)
    assert refuse("preview_edit", path="f.txt", edits=edits).code == "EDIT_CONFLICT"
    assert refuse("edit_file", path="f.txt", edits=edits).code == "EDIT_CONFLICT"
    assert (workspace / "f.txt").read_bytes() == raw


def test_expected_base_sha256_guards_against_a_changed_file(
    workspace: Path, run: Run, refuse: Refuse
) -> None:
    (workspace / "f.txt").write_text("v1\n")
    edits = [{"oldText": "v1", "newText": "v2"}]
    base = run("preview_edit", path="f.txt", edits=edits)["baseSha256"]
    (workspace / "f.txt").write_text("v1\nchanged meanwhile\n")
    assert (
        refuse("edit_file", path="f.txt", edits=edits, expectedBaseSha256=base).code
        == "EDIT_CONFLICT"
    )
    assert (workspace / "f.txt").read_text() == "v1\nchanged meanwhile\n"
    fresh = run("preview_edit", path="f.txt", edits=edits)["baseSha256"]
    run("edit_file", path="f.txt", edits=edits, expectedBaseSha256=fresh)
    assert (workspace / "f.txt").read_text() == "v2\nchanged meanwhile\n"


def test_editing_a_non_utf8_file_is_an_invalid_request(workspace: Path, refuse: Refuse) -> None:
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert (
        refuse("edit_file", path="latin1.txt", edits=[{"oldText": "caf", "newText": "x"}]).code
        == "INVALID_REQUEST"
    )
    assert (workspace / "latin1.txt").read_bytes() == b"caf\xe9\n"


def test_editing_a_missing_file_or_a_directory_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "dir").mkdir()
    edits = [{"oldText": "a", "newText": "b"}]
    assert refuse("edit_file", path="missing.txt", edits=edits).code == "NOT_FOUND"
    assert refuse("edit_file", path="dir", edits=edits).code == "INVALID_PATH"
