"""Linked-worktree lanes (§4.3): ``<root>/.worktrees/<name>`` accepted only if git made it.

A lane is trusted as a root of its own (paths and ``cwd`` resolve inside it), so a directory
that merely looks like one must be refused: a plain directory, a ``.git`` file pointing at
another repository, a symlink to someone else's worktree. Every check compares realpaths
against what ``git worktree add`` writes for this root and this name, and every refusal gets
the same message so a caller learns nothing about which check failed.
"""

from __future__ import annotations

import os
import re
import stat

from workspaces.operations.errors import OperationError
from workspaces.operations.paths import is_inside

_LANE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Git's pointer files hold one path; anything larger is not one of them.
_POINTER_MAX_BYTES = 4096


class _NotALane(Exception):
    pass


def _read_pointer(path: str) -> str:
    """The stripped text of a small regular file, refusing symlinks, FIFOs and devices."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _NotALane
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.read(fd, _POINTER_MAX_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > _POINTER_MAX_BYTES:
            raise _NotALane
        return data.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        raise _NotALane from None


def _resolve_from(base: str, pointer: str) -> str:
    # Git writes absolute paths, or paths relative to the file's directory with
    # worktree.useRelativePaths; os.path.join keeps an absolute pointer as it is.
    return os.path.realpath(os.path.join(base, pointer))


def _check(root: str, name: str) -> str:
    if not _LANE_NAME.match(name) or name.endswith(".lock"):
        raise _NotALane
    lane_path = os.path.join(root, ".worktrees", name)
    if os.path.islink(lane_path) or not os.path.isdir(lane_path):
        raise _NotALane
    lane = os.path.realpath(lane_path)
    if lane == root or not is_inside(lane, root):
        raise _NotALane
    git_dir = os.path.realpath(os.path.join(root, ".git"))
    admin_dir = os.path.realpath(os.path.join(root, ".git", "worktrees", name))
    if not os.path.isdir(git_dir) or not os.path.isdir(admin_dir):
        raise _NotALane
    # <lane>/.git must be the pointer file itself; a symlink could borrow another lane's.
    pointer = _read_pointer(os.path.join(lane, ".git"))
    if not pointer.startswith("gitdir:"):
        raise _NotALane
    if _resolve_from(lane, pointer.removeprefix("gitdir:").strip()) != admin_dir:
        raise _NotALane
    if _resolve_from(admin_dir, _read_pointer(os.path.join(admin_dir, "commondir"))) != git_dir:
        raise _NotALane
    # The admin dir points back at the lane; a mismatch means the lane was copied or moved,
    # and git itself would treat that worktree as stale.
    if _resolve_from(admin_dir, _read_pointer(os.path.join(admin_dir, "gitdir"))) != os.path.join(
        lane, ".git"
    ):
        raise _NotALane
    return lane


def resolve_lane(workspace_root: str, worktree: str) -> str:
    """The realpath of the lane ``worktree`` of ``workspace_root``; WORKER_MISMATCH otherwise."""
    try:
        return _check(os.path.realpath(workspace_root), worktree)
    except _NotALane:
        raise OperationError(
            "WORKER_MISMATCH",
            f"worktree lane '{worktree}' is not a linked worktree of this workspace",
        ) from None
