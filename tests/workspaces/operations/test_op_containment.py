"""Every escape route out of the workspace is refused before anything is read or written."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workspaces.operations import OperationError

Run = Callable[..., dict[str, Any]]
Refuse = Callable[..., OperationError]
Snapshot = Callable[[Path], dict[str, bytes]]

EDITS = [{"oldText": "TOP", "newText": "OWNED"}]


def _refuse_everything(refuse: Refuse, path: str) -> None:
    """Each file operation on ``path`` is refused as INVALID_PATH and leaks nothing."""
    calls: list[tuple[str, dict[str, object]]] = [
        ("read_file", {"path": path}),
        ("preview_edit", {"path": path, "edits": EDITS}),
        ("edit_file", {"path": path, "edits": EDITS}),
        ("write_file", {"path": path, "content": "owned", "overwrite": True}),
        ("write_file", {"path": path, "content": "owned", "overwrite": False}),
    ]
    for operation, fields in calls:
        error = refuse(operation, **fields)
        assert error.code == "INVALID_PATH", (operation, error)
        assert "SECRET" not in error.message


def test_symlink_to_a_file_outside_is_refused_before_reading(
    workspace: Path, outside: Path, refuse: Refuse, snapshot: Snapshot
) -> None:
    (workspace / "link").symlink_to(outside / "secret.txt")
    before = snapshot(outside)
    _refuse_everything(refuse, "link")
    assert snapshot(outside) == before


def test_a_symlinked_parent_directory_is_refused(
    workspace: Path, outside: Path, refuse: Refuse, snapshot: Snapshot
) -> None:
    (workspace / "linkdir").symlink_to(outside)
    before = snapshot(outside)
    _refuse_everything(refuse, "linkdir/secret.txt")
    _refuse_everything(refuse, "linkdir/new/file.txt")
    assert refuse("list_files", path="linkdir").code == "INVALID_PATH"
    assert refuse("search_text", query="SECRET", path="linkdir").code == "INVALID_PATH"
    assert snapshot(outside) == before


def test_a_symlink_chain_that_ends_outside_is_refused(
    workspace: Path, outside: Path, refuse: Refuse, snapshot: Snapshot
) -> None:
    (workspace / "hop2").symlink_to(outside / "secret.txt")
    (workspace / "hop1").symlink_to("hop2")
    (workspace / "start").symlink_to("hop1")
    before = snapshot(outside)
    _refuse_everything(refuse, "start")
    assert snapshot(outside) == before


def test_a_symlink_chain_that_stays_inside_is_followed(workspace: Path, run: Run) -> None:
    (workspace / "real.txt").write_text("inside\n")
    (workspace / "hop").symlink_to("real.txt")
    (workspace / "start").symlink_to("hop")
    assert run("read_file", path="start")["content"] == "inside"
    run("write_file", path="start", content="changed\n", overwrite=True)
    assert (workspace / "real.txt").read_text() == "changed\n"
    assert (workspace / "start").is_symlink()


def test_a_dangling_symlink_pointing_outside_is_not_written_through(
    workspace: Path, outside: Path, refuse: Refuse, snapshot: Snapshot
) -> None:
    (workspace / "dangling").symlink_to(outside / "created-by-worker.txt")
    before = snapshot(outside)
    for overwrite in (False, True):
        assert (
            refuse("write_file", path="dangling", content="x", overwrite=overwrite).code
            == "INVALID_PATH"
        )
    assert not (outside / "created-by-worker.txt").exists()
    assert snapshot(outside) == before


def test_a_symlink_to_dev_null_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "null").symlink_to("/dev/null")
    assert refuse("read_file", path="null").code == "INVALID_PATH"
    assert refuse("write_file", path="null", content="x", overwrite=True).code == "INVALID_PATH"


@pytest.mark.timeout(10)
def test_a_fifo_inside_the_workspace_is_refused_without_blocking(
    workspace: Path, refuse: Refuse
) -> None:
    os.mkfifo(workspace / "pipe")
    started = time.monotonic()
    assert refuse("read_file", path="pipe").code == "INVALID_PATH"
    assert refuse("edit_file", path="pipe", edits=EDITS).code == "INVALID_PATH"
    assert refuse("write_file", path="pipe", content="x", overwrite=True).code == "INVALID_PATH"
    assert refuse("search_text", query="x", path="pipe").code == "INVALID_PATH"
    assert time.monotonic() - started < 1


@pytest.mark.timeout(10)
def test_a_symlink_to_an_outside_fifo_is_never_opened(
    workspace: Path, outside: Path, refuse: Refuse
) -> None:
    fifo = outside / "pipe"
    os.mkfifo(fifo)
    # Holding both ends lets us put data in and later prove that nobody took it out.
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, b"SECRET")
        (workspace / "link").symlink_to(fifo)
        assert refuse("read_file", path="link").code == "INVALID_PATH"
        assert os.read(fd, 100) == b"SECRET"
    finally:
        os.close(fd)


def test_a_symlink_loop_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "a").symlink_to("b")
    (workspace / "b").symlink_to("a")
    assert refuse("read_file", path="a").code == "INVALID_PATH"


def test_cwd_through_a_symlink_to_outside_is_refused_and_nothing_runs(
    workspace: Path, outside: Path, refuse: Refuse, snapshot: Snapshot
) -> None:
    (workspace / "out").symlink_to(outside)
    before = snapshot(outside)
    assert refuse("execute_command", command="touch ran", cwd="out").code == "INVALID_PATH"
    assert snapshot(outside) == before
    assert not (workspace / "ran").exists()


def test_listing_and_search_skip_symlinks_that_leave_the_workspace(
    workspace: Path, outside: Path, run: Run
) -> None:
    (workspace / "inside.txt").write_text("SECRET inside\n")
    (workspace / "alias.txt").symlink_to("inside.txt")
    (workspace / "escape.txt").symlink_to(outside / "secret.txt")
    (workspace / "escape-dir").symlink_to(outside)
    (workspace / "broken").symlink_to("nowhere")
    assert run("list_files")["paths"] == ["alias.txt", "inside.txt"]
    matches = run("search_text", query="SECRET")["matches"]
    assert [m["path"] for m in matches] == ["alias.txt", "inside.txt"]


def test_a_symlinked_directory_inside_the_workspace_is_not_walked_twice(
    workspace: Path, run: Run
) -> None:
    (workspace / "src").mkdir()
    (workspace / "src/a.py").write_text("x")
    (workspace / "mirror").symlink_to("src")
    (workspace / "src/loop").symlink_to("..")
    assert run("list_files")["paths"] == ["src/a.py"]
    # Named explicitly, a symlinked directory inside the root is listed under the name asked for.
    assert run("list_files", path="mirror")["paths"] == ["mirror/a.py"]


@pytest.mark.parametrize("path", ["../outside/secret.txt", "/etc/passwd", "a/../../x"])
def test_paths_that_validation_should_have_refused_are_refused_again(
    refuse: Refuse, path: str
) -> None:
    assert refuse("read_file", path=path).code == "INVALID_PATH"
    assert refuse("write_file", path=path, content="x").code == "INVALID_PATH"
