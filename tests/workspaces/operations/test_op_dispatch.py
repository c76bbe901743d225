"""run_operation: the common result fields, offered operations, and the error types."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workspaces.operations import OperationError, OutcomeUnknown, run_operation

Run = Callable[..., dict[str, Any]]


def _request(operation: str, **fields: object) -> dict[str, object]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": "team:repo-7", **fields}


def test_the_result_copies_workspace_id_and_names_the_operation(workspace: Path) -> None:
    (workspace / "a.txt").write_text("x\n")
    request = _request("read_file", path="a.txt", startLine=1, maxLines=1)
    result = run_operation(request, root=str(workspace), deadline=time.monotonic() + 5)
    assert (result["protocolVersion"], result["operation"], result["workspaceId"]) == (
        1,
        "read_file",
        "team:repo-7",
    )


@pytest.mark.parametrize(
    ("operation", "fields", "code"),
    [
        ("write_file", {"path": "a.txt", "content": "x", "overwrite": False}, "WRITE_DISABLED"),
        (
            "edit_file",
            {"path": "a.txt", "edits": [{"oldText": "x", "newText": "y"}]},
            "WRITE_DISABLED",
        ),
        (
            "preview_edit",
            {"path": "a.txt", "edits": [{"oldText": "x", "newText": "y"}]},
            "WRITE_DISABLED",
        ),
        (
            "execute_command",
            {"command": "touch ran", "cwd": "", "timeoutMs": 1000, "maxOutputBytes": 10},
            "COMMAND_DISABLED",
        ),
        ("search_text", {"query": "x", "path": "", "maxResults": 5}, "WORKER_MISMATCH"),
    ],
)
def test_an_operation_the_workspace_does_not_offer_is_refused_before_it_runs(
    workspace: Path, operation: str, fields: dict[str, object], code: str
) -> None:
    (workspace / "a.txt").write_text("x\n")
    offered = frozenset({"read_file", "list_files"})
    with pytest.raises(OperationError) as caught:
        run_operation(
            _request(operation, **fields),
            root=str(workspace),
            deadline=time.monotonic() + 5,
            offered=offered,
        )
    assert caught.value.code == code
    assert (workspace / "a.txt").read_text() == "x\n"
    assert not (workspace / "ran").exists()


def test_an_unknown_operation_is_an_invalid_request(workspace: Path) -> None:
    with pytest.raises(OperationError) as caught:
        run_operation(
            _request("delete_everything"), root=str(workspace), deadline=time.monotonic() + 5
        )
    assert caught.value.code == "INVALID_REQUEST"


def test_outcome_unknown_is_an_operation_error_the_caller_can_tell_apart() -> None:
    error = OutcomeUnknown("WRITE_UNAVAILABLE", "Could not tell whether 'a.txt' was written.")
    assert isinstance(error, OperationError)
    assert (error.code, error.message) == (
        "WRITE_UNAVAILABLE",
        "Could not tell whether 'a.txt' was written.",
    )


def test_a_write_past_its_deadline_is_not_started(workspace: Path, run: Run) -> None:
    with pytest.raises(OperationError) as caught:
        run("write_file", path="late.txt", content="x", timeout_s=0)
    assert caught.value.code == "WRITE_TIMEOUT"
    assert not (workspace / "late.txt").exists()


def test_operations_import_no_django() -> None:
    import subprocess
    import sys

    code = "import sys, workspaces.operations; sys.exit('django' in sys.modules)"
    repo_root = Path(__file__).resolve().parents[3]
    assert subprocess.run([sys.executable, "-c", code], cwd=repo_root, check=False).returncode == 0
