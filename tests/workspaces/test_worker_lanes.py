"""Linked-worktree lanes end to end (§4.3): with `--linked-worktree-lanes` a `worktree` call
runs in `<root>/.worktrees/<name>` with paths relative to the lane, only when git made that
lane; without the flag, or for a forged lane, the answer is 409 WORKER_MISMATCH.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import git, git_workspace
from workerkit import call, request, ticket_counter

pytestmark = pytest.mark.e2e

LANE_ONLY = "written in lane-a only\n"
FORGED = "FORGED-LANE-CONTENT"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = git_workspace(
        tmp_path / "repo", files={"README.md": "# main\n"}, lanes=("lane-a", "lane-b")
    )
    (root / ".worktrees/lane-a/only-in-lane.txt").write_text(LANE_ONLY)
    return root


@pytest.fixture
def forgeries(repo: Path, tmp_path: Path) -> list[str]:
    """Directories under .worktrees/ that look like lanes but were not made by `git worktree add`
    for this root."""
    plain = repo / ".worktrees/plain"
    plain.mkdir()
    (plain / "secret.txt").write_text(FORGED)
    # A symlink to a real lane: borrowing lane-a's checkout under another name.
    (repo / ".worktrees/alias").symlink_to(repo / ".worktrees/lane-a", target_is_directory=True)
    # A real worktree, but of another repository, moved under this root.
    other = git_workspace(tmp_path / "other", lanes=("foreign",))
    (other / ".worktrees/foreign/secret.txt").write_text(FORGED)
    git(other, "worktree", "move", ".worktrees/foreign", str(repo / ".worktrees/foreign"))
    # A .git file that points at this root's metadata for lane-b, from a directory git never made.
    copied = repo / ".worktrees/copied"
    copied.mkdir()
    (copied / ".git").write_text(f"gitdir: {repo / '.git/worktrees/lane-b'}\n")
    (copied / "secret.txt").write_text(FORGED)
    return ["plain", "alias", "foreign", "copied", "missing"]


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_lane_call_sees_the_lane_with_paths_relative_to_it(http, owner, repo, worker_factory):
    worker_factory(owner, {"repo": repo}, lanes=True)
    read = ok(call(http, owner, request("read_file", path="only-in-lane.txt", worktree="lane-a")))
    assert (read["path"], read["content"]) == ("only-in-lane.txt", LANE_ONLY.rstrip("\n"))
    assert str(repo) not in str(read)

    listed = ok(call(http, owner, request("list_files", worktree="lane-a")))
    assert listed["paths"] == ["README.md", "only-in-lane.txt"]
    # The checkout does not see its lanes' files as its own, nor list .worktrees at all.
    assert ok(call(http, owner, request("list_files")))["paths"] == ["README.md"]
    missing = call(http, owner, request("read_file", path="only-in-lane.txt"))
    assert (missing.status_code, missing.json()["code"]) == (422, "NOT_FOUND")

    ran = ok(
        call(
            http,
            owner,
            request(
                "execute_command", command="git rev-parse --abbrev-ref HEAD", worktree="lane-b"
            ),
        )
    )
    assert (ran["exitCode"], ran["stdout"]) == (0, "lane-b\n")
    wrote = ok(
        call(http, owner, request("write_file", path="new.txt", content="b\n", worktree="lane-b"))
    )
    assert wrote["path"] == "new.txt"
    assert (repo / ".worktrees/lane-b/new.txt").read_text() == "b\n"
    assert not (repo / "new.txt").exists()


def test_a_lane_call_to_a_worker_without_lanes_is_409_and_never_reaches_it(
    http, owner, repo, worker_factory
):
    worker_factory(owner, {"repo": repo}, lanes=False)
    before = ticket_counter(owner.worker_id)
    response = call(http, owner, request("read_file", path="only-in-lane.txt", worktree="lane-a"))
    assert (response.status_code, response.json()["code"]) == (409, "WORKER_MISMATCH")
    assert LANE_ONLY not in response.text
    assert ticket_counter(owner.worker_id) == before


def test_a_forged_lane_is_409_worker_mismatch_and_nothing_in_it_is_read(
    http, owner, repo, forgeries, worker_factory
):
    worker_factory(owner, {"repo": repo}, lanes=True)
    answers = {}
    for lane in forgeries:
        response = call(http, owner, request("read_file", path="secret.txt", worktree=lane))
        assert FORGED not in response.text and str(repo) not in response.text
        answers[lane] = (response.status_code, response.json()["code"])
    assert answers == dict.fromkeys(forgeries, (409, "WORKER_MISMATCH"))
    # A command in a forged lane never runs.
    response = call(http, owner, request("execute_command", command="touch ran", worktree="plain"))
    assert (response.status_code, response.json()["code"]) == (409, "WORKER_MISMATCH")
    assert not (repo / ".worktrees/plain/ran").exists()
