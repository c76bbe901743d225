"""preview_edit and edit_file: replacements applied in order, each seeing the edits before it.

Matching is exact by default, line endings included: a CRLF file is matched and kept as CRLF,
and an ``oldText`` written with bare ``\\n`` does not match it (EDIT_CONFLICT rather than a
guess). ``matching: "tolerant"`` falls back to the whitespace-tolerant strategies of
``matching.py`` (contract §2.2.1). Either way an edit applies exactly once, or to every
occurrence with ``replaceAll``, or the whole call fails and nothing is written. A failing call
still tries every edit, so its EDIT_CONFLICT names each one that did not match
(``conflicts.py``).

Planning is paced against the call's deadline: a plan that runs out of time stops with
EDIT_NOT_STARTED (nothing was written, so a resend is safe) instead of running on after the
API has answered.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from sluice_protocol import edit_reports_matches

from workspaces.operations.conflicts import conflict_message
from workspaces.operations.errors import OperationError, Pace
from workspaces.operations.files import atomic_write
from workspaces.operations.matching import Unmatched, apply_one
from workspaces.operations.paths import describe, open_regular, resolve_for_write
from workspaces.operations.textcache import forget_texts

UTF8_BOM = b"\xef\xbb\xbf"
# Both the file before and after an edit must fit: the whole text is held in memory, and a
# preview returns it in one result.
EDIT_MAX_BYTES = 4 * 1024 * 1024
NOT_STARTED = "EDIT_NOT_STARTED"
NOT_STARTED_MESSAGE = (
    "The edits could not be planned before the call's deadline; nothing was written and the "
    "edit was not started. Resend fewer or more specific edits."
)


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
    # Per edit, in request order; None when the request did not ask for them (§2.2.1).
    matches: list[dict[str, object]] | None


def _apply(
    text: str, edits: list[dict[str, object]], rel: str, *, tolerant: bool, pace: Pace
) -> tuple[str, list[dict[str, object]]]:
    """Every edit is tried, each on the text the earlier matching ones left, so one answer
    names every edit that failed (and its line numbers mean that text); then the call fails
    if any did."""
    for number, edit in enumerate(edits, start=1):
        if not edit["oldText"]:
            raise OperationError("INVALID_REQUEST", f"Edit {number} has an empty oldText.")
    matches: list[dict[str, object]] = []
    failures: list[tuple[int, Callable[[], str]]] = []
    for number, edit in enumerate(edits, start=1):
        outcome = apply_one(
            text,
            edit,
            tolerant=tolerant,
            number=number,
            where=describe(rel),
            max_chars=EDIT_MAX_BYTES,
            pace=pace,
        )
        if isinstance(outcome, Unmatched):
            failures.append((number, outcome.reason))
            continue
        text = outcome.text
        matches.append({"strategy": outcome.strategy, "occurrences": outcome.occurrences})
    if failures:
        raise OperationError("EDIT_CONFLICT", conflict_message(len(edits), failures))
    return text, matches


def plan_edit(request: dict[str, object], *, root: str, pace: Pace) -> EditPlan:
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
    base_sha256 = hashlib.sha256(raw).hexdigest()
    # Checked before the edits are tried: against a file the caller has not seen, the
    # conflict to report is the stale base, not line numbers in text it never read.
    # (Only edit_file carries expectedBaseSha256, so a preview plans the same way.)
    expected = request.get("expectedBaseSha256")
    if expected is not None and str(expected).lower() != base_sha256:
        raise OperationError(
            "EDIT_CONFLICT", f"{describe(rel)} changed since expectedBaseSha256 was taken."
        )
    has_bom = raw.startswith(UTF8_BOM)
    try:
        text = raw[len(UTF8_BOM) :].decode("utf-8") if has_bom else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise OperationError("INVALID_REQUEST", f"{describe(rel)} is not UTF-8 text.") from None
    edits = cast(list[dict[str, object]], request["edits"])
    try:
        new_text, matches = _apply(
            text, edits, rel, tolerant=request.get("matching") == "tolerant", pace=pace
        )
    finally:
        forget_texts()
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
        base_sha256=base_sha256,
        has_bom=has_bom,
        new_text=new_text,
        new_bytes=new_bytes,
        replacements=len(edits),
        matches=matches if edit_reports_matches(request) else None,
    )


def _with_matches(result: dict[str, object], plan: EditPlan) -> dict[str, object]:
    if plan.matches is not None:
        result["matches"] = plan.matches
    return result


def planning_pace(deadline: float, clock: Callable[[], float] = time.monotonic) -> Pace:
    return Pace(deadline, NOT_STARTED, NOT_STARTED_MESSAGE, clock)


def preview_edit(
    request: dict[str, object],
    *,
    root: str,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, object]:
    plan = plan_edit(request, root=root, pace=planning_pace(deadline, clock))
    result: dict[str, object] = {
        "path": plan.rel,
        "content": plan.new_text,
        "hasUtf8Bom": plan.has_bom,
        "baseSha256": plan.base_sha256,
        "replacements": plan.replacements,
        "bytesWritten": len(plan.new_bytes),
    }
    return _with_matches(result, plan)


def edit_file(
    request: dict[str, object],
    *,
    root: str,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, object]:
    pace = planning_pace(deadline, clock)
    plan = plan_edit(request, root=root, pace=pace)
    # The last point at which the edit can still be not started.
    pace.check()
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
    result: dict[str, object] = {
        "path": plan.rel,
        "replacements": plan.replacements,
        "bytesWritten": len(plan.new_bytes),
    }
    return _with_matches(result, plan)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
