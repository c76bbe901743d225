"""Containment: every path an operation touches must resolve to a place inside its root.

A request path is already a "safe relative path" (no ``..``, no leading ``/``), but symlinks
inside the workspace can still point anywhere. So each path is resolved with
``os.path.realpath`` and refused unless the result is the root or below it, before anything
is opened. Files are then opened with ``O_NOFOLLOW`` and checked again with ``fstat``.

Accepted race: a process that swaps an intermediate directory for a symlink between the
check and the open could redirect the open. Within Sluice only ``execute_command`` creates
symlinks, and a caller allowed to run commands can already read anything the worker can, so
the check keeps file operations honest; it does not sandbox commands.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from sluice_protocol import is_safe_relative_path

from workspaces.operations.errors import OperationError, check_deadline

# Messages quote at most this much of a path: a 4096-character path must not push a refusal
# past the protocol's limit on error text (which would turn a 422 into a 502).
DESCRIBE_MAX_CHARS = 200


def describe(rel: str) -> str:
    if not rel:
        return "the workspace root"
    if len(rel) > DESCRIBE_MAX_CHARS:
        rel = rel[: DESCRIBE_MAX_CHARS // 2] + "…" + rel[-DESCRIBE_MAX_CHARS // 2 :]
    return f"'{rel}'"


def is_inside(real: str, root: str) -> bool:
    prefix = root if root.endswith(os.sep) else root + os.sep
    return real == root or real.startswith(prefix)


def in_git_dir(real: str, root: str) -> bool:
    """Whether ``real`` is a ``.git`` entry (file or directory) or lies below one."""
    return ".git" in os.path.relpath(real, root).split(os.sep)


def resolve(root: str, rel: str) -> str:
    """The realpath of ``rel`` under ``root``; INVALID_PATH when it lands outside."""
    # Validation refuses these already; checked again because this is the last line of defence.
    if "\x00" in rel or rel.startswith("/") or ".." in rel.split("/"):
        raise OperationError("INVALID_PATH", f"{describe(rel)} is not a safe relative path.")
    real = os.path.realpath(os.path.join(root, rel)) if rel else root
    if not is_inside(real, root):
        raise OperationError("INVALID_PATH", f"{describe(rel)} resolves outside the workspace.")
    return real


def _stat(real: str, rel: str) -> os.stat_result:
    try:
        return os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        raise OperationError("NOT_FOUND", f"{describe(rel)} does not exist.") from None
    except OSError as exc:
        # ELOOP (a symlink cycle), EACCES and friends: the path exists but cannot be used.
        raise OperationError(
            "INVALID_PATH", f"{describe(rel)} cannot be resolved: {exc.strerror}."
        ) from None


def resolve_dir(root: str, rel: str) -> str:
    real = resolve(root, rel)
    if not stat.S_ISDIR(_stat(real, rel).st_mode):
        raise OperationError("INVALID_PATH", f"{describe(rel)} is not a directory.")
    return real


def resolve_for_write(root: str, rel: str) -> str:
    """The realpath a write or edit of ``rel`` would change.

    A final-component symlink is followed (the link's target is written, the link stays), so a
    dangling link pointing outside the root is refused here like any other escape. Any ``.git``
    segment, in the request or in the resolved path, is refused: writing hooks or config into a
    repository's metadata would run code the next time someone uses git there.
    """
    real = resolve(root, rel)
    if real == root:
        raise OperationError("INVALID_PATH", "The workspace root is not a file.")
    if ".git" in rel.split("/") or in_git_dir(real, root):
        raise OperationError(
            "INVALID_PATH", f"{describe(rel)} is inside .git; writes there are refused."
        )
    return real


def open_regular(real: str, rel: str) -> BinaryIO:
    """Open an existing regular file for reading without ever blocking on it.

    The ``stat`` before the open keeps FIFOs and devices from being opened at all (opening a
    FIFO with no writer blocks, and reading a device can block or never end); ``O_NONBLOCK``
    covers a FIFO swapped in after the check, and the ``fstat`` comparison catches the swap.
    """
    before = _stat(real, rel)
    if stat.S_ISDIR(before.st_mode):
        raise OperationError("INVALID_PATH", f"{describe(rel)} is a directory, not a file.")
    if not stat.S_ISREG(before.st_mode):
        raise OperationError("INVALID_PATH", f"{describe(rel)} is not a regular file.")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise OperationError("NOT_FOUND", f"{describe(rel)} does not exist.") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OperationError(
                "INVALID_PATH", f"{describe(rel)} changed while being opened."
            ) from None
        raise OperationError(
            "INVALID_PATH", f"{describe(rel)} cannot be opened: {exc.strerror}."
        ) from None
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode) or (after.st_dev, after.st_ino) != (
        before.st_dev,
        before.st_ino,
    ):
        os.close(fd)
        raise OperationError("INVALID_PATH", f"{describe(rel)} changed while being opened.")
    return os.fdopen(fd, "rb")


def _subtree_precedes(rel_dir: str, after: str | None) -> bool:
    """Whether every path below ``rel_dir`` sorts at or before ``after`` (so it can be skipped).

    All such paths start with ``rel_dir + "/"``; if that prefix is smaller than ``after`` and not
    a prefix of it, they differ from ``after`` at a position where they are smaller.
    """
    if not after:
        return False
    prefix = rel_dir + "/"
    return prefix < after and not after.startswith(prefix)


def iter_tree(
    root: str,
    real_dir: str,
    rel_dir: str,
    *,
    deadline: float,
    timeout_code: str,
    after: str | None = None,
) -> Iterator[tuple[str, str]]:
    """Yield ``(relative path, realpath)`` of the regular files below ``real_dir``, unordered.

    Skipped: any ``.git`` entry, the root's ``.worktrees`` (lanes are workspaces of their own),
    non-regular files, paths that are not safe relative paths, and unreadable directories.
    Symlinks are never descended into (that could loop or list a file twice); a symlink to a
    regular file inside the root and outside ``.git`` is listed under the link's own name.
    """
    stack = [(real_dir, rel_dir)]
    while stack:
        check_deadline(deadline, timeout_code)
        directory, rel = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if name == ".git" or (name == ".worktrees" and directory == root):
                continue
            child = f"{rel}/{name}" if rel else name
            # A result path must be one a client could send back (§2.2), or the API rejects the
            # whole result: this drops names with a backslash, names that are not UTF-8, and
            # paths over the length limit (and, for a directory, everything below it).
            if not is_safe_relative_path(child):
                continue
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if (
                        is_inside(target, root)
                        and not in_git_dir(target, root)
                        and os.path.isfile(target)
                    ):
                        yield child, target
                elif entry.is_dir(follow_symlinks=False):
                    if not _subtree_precedes(child, after):
                        stack.append((entry.path, child))
                elif entry.is_file(follow_symlinks=False):
                    yield child, entry.path
            except OSError:
                continue
