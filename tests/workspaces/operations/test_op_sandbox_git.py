"""Git stays the host's (issue 34): with a real bwrap and the host's real git.

A sandboxed command may write its checkout (or lane) and commit there, but nothing git runs or
takes its configuration from: hooks, config, config.worktree, info, and the pointer files
(commondir, gitdir, a lane's ``.git``) that would send git to a configuration elsewhere. What
a command plants is shown to work unconfined first where that is cheap, so a sandbox that
stopped guarding fails here. The planted programs create a marker file outside the workspace:
the sandbox cannot write there, the host's git could.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from livesupport import git, git_workspace, wait_until
from sandboxkit import Run, command_runner

from scripts.devdemo import demo_lane
from workspaces.hostgit import run_git
from workspaces.operations import prepared
from workspaces.sandbox import Sandbox

COMMIT = "git -c user.email=t@example.com -c user.name=t commit -q"


@pytest.fixture
def boxed(sandbox: Sandbox, repo: Path) -> Run:
    return command_runner(sandbox, repo)


@pytest.fixture
def bare(repo: Path) -> Run:
    return command_runner(None, repo)


def _snapshot(*roots: Path) -> dict[str, bytes | None]:
    """Every file under ``roots`` (a directory maps to None), to compare before and after."""
    seen: dict[str, bytes | None] = {}
    for root in roots:
        if not root.exists():
            continue
        seen[str(root)] = None if root.is_dir() else root.read_bytes()
        for path in root.rglob("*") if root.is_dir() else ():
            seen[str(path)] = None if path.is_dir() else path.read_bytes()
    return seen


def _plain_git(cwd: Path, *args: str) -> None:
    """git as a person runs it: hooks, fsmonitor and all."""
    identity = ["-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(["git", *identity, *args], cwd=cwd, capture_output=True, check=True)


def _evil_common_dir(repo: Path, where: Path, marker: Path) -> Path:
    """A directory a planted ``commondir`` could name: the repository's objects and refs, and a
    configuration whose fsmonitor creates ``marker``."""
    where.mkdir()
    shutil.copytree(repo / ".git" / "objects", where / "objects")
    shutil.copytree(repo / ".git" / "refs", where / "refs")
    (where / "config").write_text(f'[core]\n\tfsmonitor = "touch {marker}; false"\n')
    return where


def _plant(marker: Path, evil: Path) -> str:
    """What an agent's command would run to have the host's git run ``touch marker``."""
    hook = f"#!/bin/sh\ntouch {marker}\n"
    return (
        f"git config core.fsmonitor 'touch {marker}; false';"
        f" printf '{hook}' > .git/hooks/post-checkout; chmod +x .git/hooks/post-checkout;"
        f" printf '{hook}' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit;"
        f" echo {evil} > .git/commondir;"
        " true"
    )


def test_a_checkout_command_cannot_write_what_git_runs_but_still_commits(
    boxed: Run, repo: Path
) -> None:
    dot_git = repo / ".git"
    # A repository may lack hooks/ and info/ (git init without templates): a missing one must
    # not be creatable either.
    shutil.rmtree(dot_git / "hooks", ignore_errors=True)
    shutil.rmtree(dot_git / "info", ignore_errors=True)
    # The first call makes what it needs to cover (an empty config.worktree per admin dir).
    assert boxed("true")["exitCode"] == 0
    before = _snapshot(
        dot_git / "config",
        dot_git / "worktrees",
        repo / ".worktrees" / "one" / ".git",
        repo / ".worktrees" / "two" / ".git",
    )
    attempts = [
        "mkdir -p .git/hooks && echo x > .git/hooks/post-checkout",
        "mkdir -p .git/info && echo '*.py filter=x' > .git/info/attributes",
        "git config core.fsmonitor 'touch planted'",
        "echo '[core] fsmonitor = x' >> .git/config",
        "echo '[core] fsmonitor = x' > .git/config.worktree",
        "echo /elsewhere > .git/commondir",
        "rm -rf .git/hooks .git/info .git/commondir .git/config",
        "mv .git .git-aside",
        "mv .git/worktrees .git/worktrees-aside",
        "mv .git/worktrees/one .git/worktrees/one-aside",
        "echo /elsewhere > .git/worktrees/one/commondir",
        "echo x > .git/worktrees/one/config.worktree",
        "echo x > .git/worktrees/one/gitdir",
        "echo 'gitdir: /elsewhere' > .worktrees/one/.git",
        "mv .worktrees .worktrees-aside",
        "mv .worktrees/two .worktrees/two-aside",
    ]
    for attempt in attempts:
        result = boxed(attempt)
        assert result["exitCode"] != 0, (attempt, result)
    assert (
        _snapshot(
            dot_git / "config",
            dot_git / "worktrees",
            repo / ".worktrees" / "one" / ".git",
            repo / ".worktrees" / "two" / ".git",
        )
        == before
    )
    assert sorted(p.name for p in (dot_git / "hooks").iterdir()) == []
    assert sorted(p.name for p in (dot_git / "info").iterdir()) == []
    assert (dot_git / "config.worktree").read_bytes() == b""
    # The sandboxes prepared for the next commands hold the placeholder too, until torn down.
    prepared.discard_all()
    assert not (dot_git / "commondir").exists()
    assert not (repo / ".git-aside").exists() and not (repo / ".worktrees-aside").exists()

    work = boxed(
        f"echo new > added.txt && git add added.txt && {COMMIT} -m add && git branch side"
        " && echo more >> added.txt && git stash -q && git stash list && git worktree list"
    )
    assert work["exitCode"] == 0, work["stderr"]
    assert git(repo, "log", "-1", "--format=%s").strip() == "add"
    assert git(repo, "branch", "--list", "side").strip() == "side"
    assert "stash@{0}" in work["stdout"]
    assert ".worktrees/one" in work["stdout"]


def test_a_lane_command_cannot_write_what_git_runs_but_still_commits(
    boxed: Run, repo: Path
) -> None:
    admin = repo / ".git" / "worktrees" / "one"
    assert boxed("true", worktree="one")["exitCode"] == 0
    before = _snapshot(admin, repo / ".worktrees" / "one" / ".git", repo / ".git" / "hooks")
    attempts = [
        "echo x > ../../.git/hooks/post-checkout",
        "git config core.fsmonitor 'touch planted'",
        "git config --worktree core.fsmonitor 'touch planted'",
        "echo x > $(git rev-parse --git-common-dir)/info/attributes",
        "echo '[core] fsmonitor = x' > $(git rev-parse --git-dir)/config.worktree",
        "echo /elsewhere > $(git rev-parse --git-dir)/commondir",
        "echo /elsewhere > $(git rev-parse --git-dir)/gitdir",
        "rm -f $(git rev-parse --git-dir)/commondir",
        "echo 'gitdir: /elsewhere' > .git",
        "rm -f .git",
    ]
    for attempt in attempts:
        result = boxed(attempt, worktree="one")
        assert result["exitCode"] != 0, (attempt, result)
    after = _snapshot(admin, repo / ".worktrees" / "one" / ".git", repo / ".git" / "hooks")
    assert after == before

    work = boxed(
        f"echo lane > lane.txt && git add lane.txt && {COMMIT} -m in-lane && git branch lane-side"
        " && echo more >> lane.txt && git stash -q && git stash list && git worktree list",
        worktree="one",
    )
    assert work["exitCode"] == 0, work["stderr"]
    assert git(repo, "log", "-1", "--format=%s", "one").strip() == "in-lane"
    assert git(repo, "branch", "--list", "lane-side").strip() == "lane-side"
    assert "stash@{0}" in work["stdout"]


def test_what_a_command_plants_never_runs_in_the_hosts_git(
    boxed: Run, bare: Run, repo: Path, scratch: Path
) -> None:
    marker = scratch / "planted-ran"
    evil = _evil_common_dir(repo, scratch / "evil", marker)
    # Unconfined, the plant works: the host's plain `git status` runs it.
    bare(_plant(marker, evil))
    _plain_git(repo, "status")
    assert marker.exists()
    marker.unlink()
    for name in ("commondir", "hooks/post-checkout", "hooks/pre-commit"):
        (repo / ".git" / name).unlink()
    git(repo, "config", "--unset", "core.fsmonitor")

    boxed(_plant(marker, evil))
    # A lane's .git file pointing at a git directory whose commondir is the planted one.
    evil_lane = scratch / "evil-lane"
    evil_lane.mkdir()
    (evil_lane / "HEAD").write_text("ref: refs/heads/one\n")
    (evil_lane / "commondir").write_text(f"{evil}\n")
    lane_plant = (
        f"git config --worktree core.fsmonitor 'touch {marker}; false';"
        f" echo '[core] fsmonitor = \"touch {marker}; false\"'"
        " > $(git rev-parse --git-dir)/config.worktree;"
        f" echo 'gitdir: {evil_lane}' > .git"
    )
    boxed(lane_plant, worktree="one")
    # The host's own git, plain, as a person or an IDE runs it; then the worker's git.
    _plain_git(repo, "status")
    _plain_git(repo / ".worktrees" / "one", "status")
    _plain_git(repo, "checkout", "-q", "-b", "after")
    _plain_git(repo, "worktree", "add", "-q", str(scratch / "lane-host"))
    _plain_git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    demo_lane(repo, "three")
    assert not marker.exists()
    prepared.discard_all()
    assert not (repo / ".git" / "commondir").exists()


def test_the_workers_own_git_runs_no_hook_and_no_fsmonitor_the_repository_names(
    repo: Path, scratch: Path
) -> None:
    # Planted unconfined (a repository that came this way, or an unsandboxed worker): the
    # worker's own git runs neither, whatever the configuration says.
    marker = scratch / "planted-ran"
    git(repo, "config", "core.fsmonitor", f"touch {marker}; false")
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in ("post-checkout", "pre-commit", "post-commit", "reference-transaction"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / name).chmod(0o755)
    subprocess.run(["git", "status"], cwd=repo, capture_output=True, check=False)
    assert marker.exists(), "the plant itself must work for this test to mean anything"
    marker.unlink()

    run_git(repo, "status")
    run_git(repo, "worktree", "add", "-q", "-b", "fresh", str(scratch / "fresh"))
    run_git(
        repo,
        "-c",
        "user.email=t@e",
        "-c",
        "user.name=t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    )
    demo_lane(repo, "demo")
    assert not marker.exists()
    assert (repo / ".worktrees" / "demo" / "FEATURE.md").exists()


def test_the_hosts_git_works_while_a_checkout_command_runs_and_nothing_is_left_after(
    boxed: Run, repo: Path
) -> None:
    # While a call runs, a placeholder covers .git/commondir (a command must not create one);
    # the host's git must read it as "no other common directory" meanwhile.
    done: dict[str, Any] = {}
    waiting = "touch started; while [ ! -e go ]; do sleep 0.01; done; git status --short"
    thread = threading.Thread(target=lambda: done.update(boxed(waiting)))
    thread.start()
    try:
        wait_until(lambda: (repo / "started").exists())
        assert (repo / ".git" / "commondir").exists()
        status = subprocess.run(
            ["git", "status", "--short"], cwd=repo, capture_output=True, text=True, check=True
        )
        assert "?? started" in status.stdout
        common = git(repo, "rev-parse", "--git-common-dir").strip()
        assert os.path.realpath(repo / common) == str(repo / ".git")
    finally:
        (repo / "go").touch()
        thread.join(30)
    assert done["exitCode"] == 0, done
    prepared.discard_all()
    assert not (repo / ".git" / "commondir").exists()
    assert not [p for p in (repo / ".git").iterdir() if ".sluice-" in p.name]


def test_a_submodules_git_directory_and_its_git_file_are_guarded_too(
    boxed: Run, bare: Run, repo: Path, scratch: Path
) -> None:
    library = git_workspace(scratch / "library")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "lib")
    git(repo, "commit", "-q", "-m", "lib")
    module = repo / ".git" / "modules" / "lib"
    marker = scratch / "planted-ran"
    plant = (
        f"git -C lib config core.fsmonitor 'touch {marker}; false'"
        f" || printf '#!/bin/sh\\ntouch {marker}\\n' > .git/modules/lib/hooks/post-checkout"
    )
    # Unconfined, the host's git in the submodule runs what was planted.
    bare(plant)
    _plain_git(repo / "lib", "status")
    assert marker.exists()
    marker.unlink()
    git(repo / "lib", "config", "--unset", "core.fsmonitor")

    assert boxed("true")["exitCode"] == 0
    before = _snapshot(module / "config", module / "hooks", module / "info", repo / "lib" / ".git")
    attempts = [
        plant,
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/modules/lib/hooks/post-checkout",
        "echo /elsewhere > .git/modules/lib/commondir",
        "echo 'gitdir: /elsewhere' > lib/.git",
        "mv lib lib-aside",
        "mv .git/modules .git/modules-aside",
    ]
    for attempt in attempts:
        result = boxed(attempt)
        assert result["exitCode"] != 0, (attempt, result)
    after = _snapshot(module / "config", module / "hooks", module / "info", repo / "lib" / ".git")
    assert after == before
    prepared.discard_all()
    assert not (module / "commondir").exists()
    _plain_git(repo / "lib", "status")
    _plain_git(repo, "status")
    assert not marker.exists()
    work = boxed(f"echo x > lib/new.txt && cd lib && git add new.txt && {COMMIT} -m in-submodule")
    assert work["exitCode"] == 0, work["stderr"]


def test_the_commondir_placeholder_stays_while_any_call_holds_it_and_a_left_one_is_removed(
    boxed: Run, repo: Path
) -> None:
    placeholder = repo / ".git" / "commondir"
    # What a worker killed mid-call leaves: git reads it as no other common directory.
    placeholder.write_text(".\n")
    _plain_git(repo, "status")
    results: list[dict[str, Any]] = []
    waiting = (
        "touch started-{n}; while [ ! -e go-{n} ]; do sleep 0.01; done; echo x > .git/commondir"
    )
    threads = [
        threading.Thread(target=lambda n=n: results.append(boxed(waiting.format(n=n))))
        for n in (1, 2)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: (repo / "started-1").exists() and (repo / "started-2").exists())
        (repo / "go-1").touch()
        threads[0].join(30)
        # The other call still runs: its placeholder must still cover the name.
        assert placeholder.read_text() == ".\n"
    finally:
        (repo / "go-1").touch()
        (repo / "go-2").touch()
        for thread in threads:
            thread.join(30)
    assert [r["exitCode"] for r in results] == [2, 2], results
    # The sandboxes prepared for the next commands hold it as calls do, until torn down.
    prepared.discard_all()
    assert not placeholder.exists()


@pytest.mark.xfail(
    strict=True,
    reason="open (docs/security.md): a repository a command makes and adds as a submodule "
    "has a configuration of its own, and a person's `git status` at the root runs its fsmonitor",
)
def test_a_repository_a_command_adds_as_a_submodule_runs_nothing_in_a_persons_git(
    boxed: Run, repo: Path, scratch: Path
) -> None:
    marker = scratch / "planted-ran"
    plant = (
        "git init -q nested && cd nested"
        f" && {COMMIT} --allow-empty -m nested"
        f" && git config core.fsmonitor 'touch {marker}; false'"
        " && echo x > dirty && cd .. && git add nested"
    )
    assert boxed(plant)["exitCode"] == 0
    # The worker's own git passes its -c settings on to the git it starts in the submodule.
    run_git(repo, "status")
    assert not marker.exists()
    _plain_git(repo, "status")
    assert not marker.exists()
