"""read_file, list_files and write_file, plus the atomic write that edit_file shares."""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import secrets
import stat
from typing import BinaryIO

from sluice_protocol import MAX_WRITE_BYTES, READ_MAX_BYTES

from workspaces.operations.errors import OperationError, OutcomeUnknown, check_deadline
from workspaces.operations.instructions import read_instruction
from workspaces.operations.paths import (
    describe,
    iter_tree,
    open_regular,
    resolve,
    resolve_dir,
    resolve_for_write,
)

# Lines before the window are skipped in pieces of this size, so a file with one 2 GB line
# costs time (bounded by the deadline) but never memory.
_SKIP_CHUNK_BYTES = 64 * 1024


def _skip_lines(f: BinaryIO, count: int, deadline: float) -> None:
    skipped = 0
    pieces = 0
    while skipped < count:
        piece = f.readline(_SKIP_CHUNK_BYTES)
        if not piece:
            return
        if piece.endswith(b"\n"):
            skipped += 1
        pieces += 1
        if pieces % 256 == 0:
            check_deadline(deadline, "READ_TIMEOUT")


def _decoded(line: bytes) -> tuple[str, int]:
    """A line's text and its size in UTF-8: invalid bytes become U+FFFD (3 bytes each), so a
    binary line can grow when decoded and the budget is counted on what is sent."""
    try:
        return line.decode("utf-8"), len(line)
    except UnicodeDecodeError:
        text = line.decode("utf-8", errors="replace")
        return text, len(text.encode("utf-8"))


def read_file(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    """The lines ``startLine..endLine``, each without its terminator, joined with ``\\n``.

    Lines end at ``\\n`` only (a ``\\r`` before it stays in the line), so ``content``
    splits on ``\\n`` into exactly ``endLine - startLine + 1`` pieces, the rule LibreChat
    checks on every read (contract §2.2). A window stops early, truncated, where the next line
    would take ``content`` past READ_MAX_BYTES; only a first line that alone is too large is
    refused. An instruction read (``instructionSha256``, §2.2.1) is the whole file instead.
    """
    if "instructionSha256" in request:
        return read_instruction(request, root=root)
    rel = str(request["path"])
    start_line = int(str(request["startLine"]))
    max_lines = int(str(request["maxLines"]))
    lines: list[str] = []
    size = 0  # UTF-8 bytes of the content so far, the joining newlines included
    truncated = False
    with open_regular(resolve(root, rel), rel) as f:
        _skip_lines(f, start_line - 1, deadline)
        while len(lines) < max_lines:
            budget = READ_MAX_BYTES - size - (1 if lines else 0)
            # Two bytes past the budget: room for the line's own "\n", and one more to tell
            # "fits exactly" from "too long" without reading the rest of a huge line.
            piece = f.readline(budget + 2)
            if not piece:
                break
            text, length = _decoded(piece[:-1] if piece.endswith(b"\n") else piece)
            if length > budget:
                if not lines:
                    raise OperationError(
                        "READ_LIMIT_EXCEEDED",
                        f"Line {start_line} of {describe(rel)} alone exceeds {READ_MAX_BYTES} "
                        "bytes; it cannot be read as text.",
                    )
                truncated = True
                break
            size += length + (1 if lines else 0)
            lines.append(text)
        else:
            truncated = f.read(1) != b""
    end_line = start_line + len(lines) - 1
    result: dict[str, object] = {
        "path": rel,
        "content": "\n".join(lines),
        "startLine": start_line,
        "endLine": end_line,
        "truncated": truncated,
    }
    if truncated:
        result["nextStartLine"] = end_line + 1
    return result


def list_files(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    rel = str(request.get("path") or "")
    max_results = int(str(request["maxResults"]))
    after = str(request.get("afterPath") or "") or None
    real = resolve_dir(root, rel)
    candidates = (
        path
        for path, _ in iter_tree(
            root, real, rel, deadline=deadline, timeout_code="LIST_TIMEOUT", after=after
        )
        if after is None or path > after
    )
    # nsmallest keeps only max_results + 1 names in memory however large the tree is; the
    # extra one tells whether another page exists.
    page = heapq.nsmallest(max_results + 1, candidates)
    truncated = len(page) > max_results
    page = page[:max_results]
    result: dict[str, object] = {"paths": page, "truncated": truncated}
    if truncated:
        result["nextAfterPath"] = page[-1]
    return result


# Deeper paths are refused before any directory is made (see write_file).
MAX_WRITE_DEPTH = 256
NAME_MAX_BYTES = 255


def _write_error(rel: str, exc: OSError) -> OperationError:
    # A name or path the filesystem cannot hold is the caller's path, not a passing failure
    # (a 503 would invite a resend that can never succeed).
    if exc.errno == errno.ENAMETOOLONG:
        return OperationError("INVALID_PATH", f"{describe(rel)} is too long for the filesystem.")
    return OperationError("WRITE_UNAVAILABLE", f"Could not write {describe(rel)}: {exc.strerror}.")


def atomic_write(real: str, rel: str, data: bytes, *, mode: int | None, exclusive: bool) -> None:
    """Replace (or, when ``exclusive``, create) ``real`` so readers see old or new, never half.

    The data goes to a temporary file in the same directory, is fsynced, then renamed over
    the target (``os.replace``) or hard-linked to it (``os.link``, which fails if the target
    appeared meanwhile, so ``overwrite: false`` holds even against a racing writer). A failure
    before the rename leaves the target untouched and is reported as a plain error; a failure
    of the rename itself is ``OutcomeUnknown``.
    """
    directory, name = os.path.split(real)
    # The temporary name stays within NAME_MAX (255 bytes) whatever the target's name is.
    stem = name.encode()[:200].decode(errors="ignore")
    tmp = os.path.join(directory, f".{stem}.{secrets.token_hex(6)}.sluice-tmp")
    try:
        # 0o666 lets the umask decide a new file's mode, as any editor would.
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except OSError as exc:
        raise _write_error(rel, exc) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _write_error(rel, exc) from None
    _commit(tmp, real, rel, exclusive=exclusive)
    # Best effort: the rename is already visible to every reader; this only makes it durable.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _commit(tmp: str, real: str, rel: str, *, exclusive: bool) -> None:
    try:
        if exclusive:
            try:
                os.link(tmp, real)
            except OSError as exc:
                # Some filesystems have no hard links; fall back to a checked rename there.
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK, errno.EXDEV):
                    raise
                if os.path.lexists(real):
                    raise FileExistsError(errno.EEXIST, "exists") from None
                os.replace(tmp, real)
            else:
                # The target exists now; a temp name left behind is untidy, not an unknown outcome.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        else:
            os.replace(tmp, real)
    except FileExistsError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OperationError(
            "FILE_EXISTS", f"{describe(rel)} already exists and overwrite is false."
        ) from None
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutcomeUnknown(
            "WRITE_UNAVAILABLE",
            f"Could not tell whether {describe(rel)} was written: {exc.strerror}.",
        ) from None


def write_file(request: dict[str, object], *, root: str, deadline: float) -> dict[str, object]:
    rel = str(request["path"])
    overwrite = request.get("overwrite") is True
    try:
        data = str(request["content"]).encode("utf-8")
    except UnicodeEncodeError:
        raise OperationError("INVALID_REQUEST", "content is not valid UTF-8 text.") from None
    if len(data) > MAX_WRITE_BYTES:
        raise OperationError("WRITE_LIMIT_EXCEEDED", f"content exceeds {MAX_WRITE_BYTES} bytes.")
    real = resolve_for_write(root, rel)
    try:
        existing: os.stat_result | None = os.lstat(real)
    except FileNotFoundError:
        existing = None
    except NotADirectoryError:
        raise OperationError(
            "INVALID_PATH", f"A parent of {describe(rel)} is not a directory."
        ) from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise OperationError("INVALID_PATH", f"{describe(rel)} exists and is not a regular file.")
    if existing is not None and not overwrite:
        raise OperationError(
            "FILE_EXISTS", f"{describe(rel)} already exists and overwrite is false."
        )
    check_deadline(deadline, "WRITE_TIMEOUT")
    if rel.count("/") >= MAX_WRITE_DEPTH:
        # os.makedirs recurses once per missing parent: a path of ~1,500 short segments would
        # exhaust the stack half-way through and leave an unknown state behind.
        raise OperationError("INVALID_PATH", f"{describe(rel)} is nested too deeply to create.")
    if any(len(part.encode()) > NAME_MAX_BYTES for part in rel.split("/")):
        # Checked before any directory is made: no filesystem here holds such a name.
        raise OperationError(
            "INVALID_PATH", f"{describe(rel)} has a name too long for the filesystem."
        )
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OperationError(
            "INVALID_PATH", f"A parent of {describe(rel)} is not a directory."
        ) from None
    except OSError as exc:
        raise _write_error(rel, exc) from None
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else None
    atomic_write(real, rel, data, mode=mode, exclusive=not overwrite)
    return {"path": rel, "created": existing is None, "bytesWritten": len(data)}
