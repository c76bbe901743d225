"""Instruction files (AGENTS.md, CLAUDE.md): what a worker advertises, and the exact read.

Contract §2.2.1. LibreChat reads such a file whole and checks its SHA-256 and length against
what the worker advertised, so the read answers the file's exact text (a BOM, CRLF and the
final newline kept) or refuses; it never answers a window or a part. Only a file that could be
served is advertised: a regular file (not a symlink) directly at the workspace root, at most
INSTRUCTION_MAX_BYTES, valid UTF-8 without NUL.

Refusals follow LibreChat's reference worker: a file that is gone, changed since it was
advertised (another SHA-256), or no longer servable is INVALID_PATH; one that grew past the
bound is READ_LIMIT_EXCEEDED.
"""

from __future__ import annotations

import hashlib
import os
import stat

from sluice_protocol import INSTRUCTION_FILES, INSTRUCTION_MAX_BYTES

from workspaces.operations.errors import OperationError
from workspaces.operations.paths import open_regular


class _Unservable(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _load(root: str, name: str) -> tuple[str, bytes]:
    """The file's text and raw bytes, or _Unservable saying why it cannot be served."""
    real = os.path.join(root, name)
    try:
        if not stat.S_ISREG(os.lstat(real).st_mode):
            raise _Unservable("INVALID_PATH", f"{name} is not a regular file.")
        with open_regular(real, name) as f:
            raw = f.read(INSTRUCTION_MAX_BYTES + 1)
    except FileNotFoundError:
        raise _Unservable("INVALID_PATH", f"{name} does not exist at the workspace root.") from None
    except OperationError as exc:
        raise _Unservable("INVALID_PATH", exc.message) from None
    except OSError as exc:
        raise _Unservable("INVALID_PATH", f"{name} cannot be read: {exc.strerror}.") from None
    if len(raw) > INSTRUCTION_MAX_BYTES:
        raise _Unservable(
            "READ_LIMIT_EXCEEDED", f"{name} is larger than {INSTRUCTION_MAX_BYTES} bytes."
        )
    try:
        text = raw.decode("utf-8")  # a BOM stays in the text as U+FEFF, as the bytes have it
    except UnicodeDecodeError:
        raise _Unservable("INVALID_PATH", f"{name} is not UTF-8 text.") from None
    if "\x00" in text:
        raise _Unservable("INVALID_PATH", f"{name} holds a NUL byte; it is not text.")
    return text, raw


def instruction_files(root: str) -> list[dict[str, object]]:
    """What a worker advertises for the workspace at ``root``: path, bytes and SHA-256 of
    each instruction file it could serve, in name order."""
    found: list[dict[str, object]] = []
    for name in sorted(INSTRUCTION_FILES):
        try:
            _, raw = _load(root, name)
        except _Unservable:
            continue
        found.append({"path": name, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()})
    return found


def read_instruction(request: dict[str, object], *, root: str) -> dict[str, object]:
    """The whole file as the §2.2.1 result, when its SHA-256 is the one the caller holds."""
    name = str(request["path"])
    if name not in INSTRUCTION_FILES:
        # Validation refuses this already; the worker does not serve other names whole.
        raise OperationError("INVALID_REQUEST", "Only AGENTS.md and CLAUDE.md are read whole.")
    try:
        text, raw = _load(root, name)
    except _Unservable as exc:
        raise OperationError(exc.code, exc.message) from None
    if hashlib.sha256(raw).hexdigest() != request["instructionSha256"]:
        raise OperationError(
            "INVALID_PATH", f"{name} changed since it was advertised (its SHA-256 differs)."
        )
    return {
        "path": name,
        "content": text,
        "startLine": 1,
        # Pieces of content split on "\n": a final newline counts the empty piece after it.
        "endLine": text.count("\n") + 1,
        "truncated": False,
    }
