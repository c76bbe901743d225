"""preview_edit and edit_file: exact-text replacements applied in order.

Matching is exact, line endings included: a CRLF file is matched and kept as CRLF, and an
``oldText`` written with bare ``\\n`` does not match it (EDIT_CONFLICT rather than a guess).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import cast

from workspaces.operations.errors import OperationError, check_deadline
from workspaces.operations.files import atomic_write
from workspaces.operations.paths import describe, open_regular, resolve_for_write

UTF8_BOM = b"\xef\xbb\xbf"
# Both the file before and after an edit must fit: the whole text is held in memory, and a
# preview returns it in one result.
EDIT_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class EditPlan:
    real: str
    rel: str
    before: os.stat_result
    base_sha256: str
    has_bom: bool
    new_text: str
    new_bytes: bytes
    replacements: int


def _apply(text: str, edits: list[dict[str, object]], rel: str) -> tuple[str, int]:
    total = 0
    for number, edit in enumerate(edits, start=1):
        old, new = str(edit["oldText"]), str(edit["newText"])
        if not old:
            raise OperationError("INVALID_REQUEST", f"Edit {number} has an empty oldText.")
        count = text.count(old)
        if count == 0:
            raise OperationError(
                "EDIT_CONFLICT", f"Edit {number}: oldText was not found in {describe(rel)}."
            )
        if count > 1 and edit.get("replaceAll") is not True:
            raise OperationError(
                "EDIT_CONFLICT",
                f"Edit {number}: oldText occurs {count} times in {describe(rel)}; "
                "add context or set replaceAll.",
            )
        text = text.replace(old, new)
        total += count
    return text, total


def plan_edit(request: dict[str, object], *, root: str) -> EditPlan:
    """Read the file once and compute the edit; nothing is written here."""
    rel = str(request["path"])
    # preview_edit is refused in .git too, so a preview never promises an edit that would fail.
    real = resolve_for_write(root, rel)
    with open_regular(real, rel) as f:
        before = os.fstat(f.fileno())
        raw = f.read(EDIT_MAX_BYTES + 1)
    if len(raw) > EDIT_MAX_BYTES:
        raise OperationError(
            "READ_LIMIT_EXCEEDED", f"{describe(rel)} is larger than {EDIT_MAX_BYTES} bytes."
        )
    has_bom = raw.startswith(UTF8_BOM)
    try:
        text = raw[len(UTF8_BOM) :].decode("utf-8") if has_bom else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OperationError("INVALID_REQUEST", f"{describe(rel)} is not UTF-8 text.") from None
    new_text, replacements = _apply(text, cast(list[dict[str, object]], request["edits"]), rel)
    try:
        new_bytes = (UTF8_BOM if has_bom else b"") + new_text.encode("utf-8")
    except UnicodeEncodeError:
        raise OperationError("INVALID_REQUEST", "newText is not valid UTF-8 text.") from None
    if len(new_bytes) > EDIT_MAX_BYTES:
        raise OperationError(
            "WRITE_LIMIT_EXCEEDED",
            f"The edited {describe(rel)} would exceed {EDIT_MAX_BYTES} bytes.",
        )
    return EditPlan(
        real=real,
        rel=rel,
        before=before,
        base_sha256=hashlib.sha256(raw).hexdigest(),
        has_bom=has_bom,
        new_text=new_text,
        new_bytes=new_bytes,
        replacements=replacements,
    )


def preview_edit(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    plan = plan_edit(request, root=root)
    return {
        "path": plan.rel,
        "content": plan.new_text,
        "hasUtf8Bom": plan.has_bom,
        "baseSha256": plan.base_sha256,
        "replacements": plan.replacements,
        "bytesWritten": len(plan.new_bytes),
    }


def edit_file(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    plan = plan_edit(request, root=root)
    expected = request.get("expectedBaseSha256")
    if expected is not None and str(expected).lower() != plan.base_sha256:
        raise OperationError(
            "EDIT_CONFLICT", f"{describe(plan.rel)} changed since expectedBaseSha256 was taken."
        )
    check_deadline(deadline, "WRITE_TIMEOUT")
    # Narrows (does not close) the window in which another process changes the file between
    # our read and the rename; a change seen here is a conflict and nothing is written.
    try:
        now: os.stat_result | None = os.stat(plan.real)
    except OSError:
        now = None
    if now is None or _identity(now) != _identity(plan.before):
        raise OperationError(
            "EDIT_CONFLICT", f"{describe(plan.rel)} changed while it was being edited."
        )
    atomic_write(
        plan.real, plan.rel, plan.new_bytes, mode=stat.S_IMODE(plan.before.st_mode), exclusive=False
    )
    return {
        "path": plan.rel,
        "replacements": plan.replacements,
        "bytesWritten": len(plan.new_bytes),
    }


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
