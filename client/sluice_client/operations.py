"""One helper per operation, shared by both clients: each builds the request and calls
`execute`. Options left as None are omitted, so the contract's defaults apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from sluice_protocol import PROTOCOL_VERSION

R = TypeVar("R")


def build_request(
    operation: str,
    workspace_id: str,
    *,
    workspace_instance_id: str | None = None,
    worktree: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "protocolVersion": PROTOCOL_VERSION,
        "operation": operation,
        "workspaceId": workspace_id,
    }
    if workspace_instance_id is not None:
        request["workspaceInstanceId"] = workspace_instance_id
    if worktree is not None:
        request["worktree"] = worktree
    request.update({name: value for name, value in fields.items() if value is not None})
    return request


def _edits(edits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(edit) for edit in edits]


class OperationHelpers(Generic[R]):
    """`R` is what `execute` returns: a dict for `Client`, an awaitable for `AsyncClient`.

    Keyword arguments beyond the operation's fields (`workspace_instance_id`, `worktree`,
    `deadline`, `cancel`, `request_id`, per-call budgets) are passed through.
    """

    def execute(self, request: Mapping[str, Any], **options: Any) -> R:
        raise NotImplementedError

    def _run(
        self, operation: str, workspace_id: str, fields: dict[str, Any], options: dict[str, Any]
    ) -> R:
        lane = {key: options.pop(key, None) for key in ("workspace_instance_id", "worktree")}
        return self.execute(build_request(operation, workspace_id, **lane, **fields), **options)

    def read_file(
        self,
        workspace_id: str,
        path: str,
        *,
        start_line: int | None = None,
        max_lines: int | None = None,
        **options: Any,
    ) -> R:
        fields = {"path": path, "startLine": start_line, "maxLines": max_lines}
        return self._run("read_file", workspace_id, fields, options)

    def list_files(
        self,
        workspace_id: str,
        path: str = "",
        *,
        max_results: int | None = None,
        after_path: str | None = None,
        **options: Any,
    ) -> R:
        fields = {"path": path, "maxResults": max_results, "afterPath": after_path}
        return self._run("list_files", workspace_id, fields, options)

    def search_text(
        self,
        workspace_id: str,
        query: str,
        *,
        path: str | None = None,
        max_results: int | None = None,
        **options: Any,
    ) -> R:
        fields = {"query": query, "path": path, "maxResults": max_results}
        return self._run("search_text", workspace_id, fields, options)

    def write_file(
        self, workspace_id: str, path: str, content: str, *, overwrite: bool = False, **options: Any
    ) -> R:
        fields = {"path": path, "content": content, "overwrite": overwrite}
        return self._run("write_file", workspace_id, fields, options)

    def preview_edit(
        self, workspace_id: str, path: str, edits: Sequence[Mapping[str, Any]], **options: Any
    ) -> R:
        return self._run(
            "preview_edit", workspace_id, {"path": path, "edits": _edits(edits)}, options
        )

    def edit_file(
        self,
        workspace_id: str,
        path: str,
        edits: Sequence[Mapping[str, Any]],
        *,
        expected_base_sha256: str | None = None,
        **options: Any,
    ) -> R:
        fields = {"path": path, "edits": _edits(edits), "expectedBaseSha256": expected_base_sha256}
        return self._run("edit_file", workspace_id, fields, options)

    def execute_command(
        self,
        workspace_id: str,
        command: str,
        *,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        max_output_bytes: int | None = None,
        **options: Any,
    ) -> R:
        fields = {
            "command": command,
            "cwd": cwd,
            "timeoutMs": timeout_ms,
            "maxOutputBytes": max_output_bytes,
        }
        return self._run("execute_command", workspace_id, fields, options)
