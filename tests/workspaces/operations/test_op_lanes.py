"""resolve_lane against real git worktrees and against forgeries of them."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from workspaces.operations import OperationError, resolve_lane, run_operation

MESSAGE = "worktree lane '{}' is not a linked worktree of this workspace"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _repo(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q")
    (path / "README.md").write_text("hello\n")
    _git(path, "add", "README.md")
    _git(path, "commit", "-q", "-m", "init")
    return Path(os.path.realpath(path))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = _repo(tmp_path / "repo")
    _git(root, "worktree", "add", "-q", ".worktrees/lane1", "-b", "lane1")
    return root


@pytest.fixture
def other_repo(tmp_path: Path) -> Path:
    return _repo(tmp_path / "other")


def _refused(root: Path, name: str) -> None:
    with pytest.raises(OperationError) as caught:
        resolve_lane(str(root), name)
    assert (caught.value.code, caught.value.message) == ("WORKER_MISMATCH", MESSAGE.format(name))


def test_a_real_linked_worktree_is_accepted_and_operations_run_inside_it(repo: Path) -> None:
    lane = resolve_lane(str(repo), "lane1")
    assert lane == str(repo / ".worktrees/lane1")
    (repo / ".worktrees/lane1/only-in-lane.txt").write_text("lane\n")
    request = {
        "protocolVersion": 1,
        "operation": "list_files",
        "workspaceId": "ws-1",
        "path": "",
        "maxResults": 10,
    }
    result = run_operation(request, root=lane, deadline=time.monotonic() + 10)
    assert result["paths"] == ["README.md", "only-in-lane.txt"]


def test_a_lane_root_refuses_writes_to_its_git_pointer_file(repo: Path) -> None:
    lane = resolve_lane(str(repo), "lane1")
    request = {
        "protocolVersion": 1,
        "operation": "write_file",
        "workspaceId": "ws-1",
        "path": ".git",
        "content": "gitdir: /elsewhere\n",
        "overwrite": True,
    }
    with pytest.raises(OperationError) as caught:
        run_operation(request, root=lane, deadline=time.monotonic() + 10)
    assert caught.value.code == "INVALID_PATH"


def test_a_missing_lane_is_refused(repo: Path) -> None:
    _refused(repo, "lane2")


def test_a_plain_directory_is_not_a_lane(repo: Path) -> None:
    (repo / ".worktrees/plain").mkdir()
    (repo / ".worktrees/plain/file.txt").write_text("x")
    _refused(repo, "plain")


def test_a_git_file_pointing_at_another_repository_is_refused(repo: Path, other_repo: Path) -> None:
    _git(other_repo, "worktree", "add", "-q", str(other_repo.parent / "elsewhere"), "-b", "x")
    fake = repo / ".worktrees/fake"
    fake.mkdir()
    (fake / ".git").write_text(f"gitdir: {other_repo}/.git/worktrees/elsewhere\n")
    _refused(repo, "fake")


def test_a_copy_of_a_real_lane_under_another_name_is_refused(repo: Path) -> None:
    shutil.copytree(repo / ".worktrees/lane1", repo / ".worktrees/copy")
    _refused(repo, "copy")


def test_a_lane_moved_away_from_where_git_put_it_is_refused(repo: Path) -> None:
    # Same name, same .git pointer, but the admin dir's back-pointer names the old location.
    _git(repo, "worktree", "add", "-q", ".worktrees/lane2", "-b", "lane2")
    (repo / ".git/worktrees/lane2/gitdir").write_text(f"{repo}/.worktrees/lane1/.git\n")
    _refused(repo, "lane2")


def test_a_symlink_to_another_repositorys_worktree_is_refused(repo: Path, other_repo: Path) -> None:
    _git(other_repo, "worktree", "add", "-q", ".worktrees/lane9", "-b", "lane9")
    (repo / ".worktrees/lane9").symlink_to(other_repo / ".worktrees/lane9")
    _refused(repo, "lane9")


def test_a_lane_of_a_different_repository_placed_inside_the_root_is_refused(
    repo: Path, other_repo: Path
) -> None:
    _git(other_repo, "worktree", "add", "-q", str(repo / ".worktrees/foreign"), "-b", "foreign")
    _refused(repo, "foreign")


def test_a_forged_admin_dir_whose_commondir_points_elsewhere_is_refused(
    repo: Path, other_repo: Path
) -> None:
    admin = repo / ".git/worktrees/forged"
    admin.mkdir()
    (admin / "commondir").write_text(f"{other_repo}/.git\n")
    (admin / "gitdir").write_text(f"{repo}/.worktrees/forged/.git\n")
    lane = repo / ".worktrees/forged"
    lane.mkdir()
    (lane / ".git").write_text(f"gitdir: {admin}\n")
    _refused(repo, "forged")


def test_a_lane_whose_git_file_is_a_symlink_is_refused(repo: Path) -> None:
    _git(repo, "worktree", "add", "-q", ".worktrees/lane2", "-b", "lane2")
    pointer = repo / ".worktrees/lane2/.git"
    saved = repo / "pointer-copy"
    saved.write_text(pointer.read_text())
    pointer.unlink()
    pointer.symlink_to(saved)
    _refused(repo, "lane2")


def test_the_worktrees_directory_itself_being_a_symlink_out_of_the_root_is_refused(
    tmp_path: Path, other_repo: Path
) -> None:
    _git(other_repo, "worktree", "add", "-q", ".worktrees/lane1", "-b", "lane1")
    root = _repo(tmp_path / "victim")
    (root / ".worktrees").symlink_to(other_repo / ".worktrees")
    _refused(root, "lane1")


@pytest.mark.parametrize("name", ["../repo", "lane1/..", ".hidden", "x.lock", ""])
def test_names_that_are_not_lane_names_are_refused(repo: Path, name: str) -> None:
    _refused(repo, name)
