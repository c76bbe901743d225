"""Fixtures for the workspace operations: real directories, real files, no Django database.

``run`` and ``refuse`` build complete requests (every default filled, as validation would)
so each test only names the fields it is about.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from livesupport import git_workspace

from workspaces.operations import OperationError, prepared, run_operation
from workspaces.sandbox import Sandbox, worker_sandbox

DEFAULTS: dict[str, dict[str, object]] = {
    "read_file": {"startLine": 1, "maxLines": 200},
    "list_files": {"path": "", "maxResults": 100},
    "search_text": {"path": "", "maxResults": 50},
    "write_file": {"overwrite": False},
    "preview_edit": {},
    "edit_file": {},
    "execute_command": {"cwd": "", "timeoutMs": 30_000, "maxOutputBytes": 256 * 1024},
}

Run = Callable[..., dict[str, object]]
Refuse = Callable[..., OperationError]


@pytest.fixture(autouse=True)
def _no_prepared_sandbox_left() -> Iterator[None]:
    """A test's sandboxes prepared for commands it did not run end with it."""
    yield
    prepared.discard_all()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory for a sandboxed test's repository and worker code. Not under /tmp: the
    sandbox's private /tmp would hide it whatever else it did."""
    where = "/var/tmp" if os.path.isdir("/var/tmp") else None
    path = Path(os.path.realpath(tempfile.mkdtemp(prefix="sluice-sandboxed-", dir=where)))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def repo(scratch: Path) -> Path:
    """A git repository with two linked worktree lanes, `one` and `two`."""
    return Path(os.path.realpath(git_workspace(scratch / "repo", lanes=("one", "two"))))


@pytest.fixture
def sandbox(scratch: Path, repo: Path) -> Sandbox:
    """The worker's sandbox over `repo`, its code under `scratch`."""
    (scratch / "code" / "var").mkdir(parents=True)
    return worker_sandbox(base_dir=str(scratch / "code"), workspace_roots=[str(repo)])


def make_request(operation: str, **fields: object) -> dict[str, object]:
    return {
        "protocolVersion": 1,
        "operation": operation,
        "workspaceId": "ws-1",
        **DEFAULTS[operation],
        **fields,
    }


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return Path(os.path.realpath(root))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace, holding a secret the operations must never touch."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text("TOP SECRET\n")
    return directory


@pytest.fixture
def run(workspace: Path) -> Run:
    def _run(
        operation: str, *, root: Path | None = None, timeout_s: float = 30, **fields: object
    ) -> dict[str, object]:
        request = make_request(operation, **fields)
        return run_operation(
            request, root=str(root or workspace), deadline=time.monotonic() + timeout_s
        )

    return _run


@pytest.fixture
def refuse(run: Run, tmp_path: Path) -> Refuse:
    """Run a call that must fail; return the error after checking it names no host path."""

    def _refuse(operation: str, **fields: object) -> OperationError:
        with pytest.raises(OperationError) as caught:
            run(operation, **fields)
        assert str(tmp_path) not in caught.value.message
        return caught.value

    return _refuse


Snapshot = Callable[[Path], dict[str, bytes]]


@pytest.fixture
def snapshot() -> Snapshot:
    """Every entry below a directory with its content, to prove nothing there changed."""

    def _snapshot(directory: Path) -> dict[str, bytes]:
        return {
            str(path.relative_to(directory)): path.read_bytes() if path.is_file() else b"<dir>"
            for path in sorted(directory.rglob("*"))
        }

    return _snapshot
