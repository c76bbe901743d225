"""The throwaway filesystem a fuzz run works in: a git workspace and what surrounds it.

    <parent>/workspace/        the worker's workspace (a real git checkout)
        README.md, src/app.py, docs/notes.md, "unicode-é ✓.txt"
        inside-link        -> README.md                 (stays inside: followed)
        escape             -> <parent>/outside          (a directory outside)
        escape-file        -> ../outside/canary.txt     (a file outside)
        dangling           -> ../outside/not-yet.txt    (a write through it would land outside)
        prefix-escape      -> ../workspace2/secret.txt  (a sibling whose name starts the same)
        docs/up            -> ../..                     (the parent, through a nested link)
        .worktrees/lane-a/ a linked worktree (a lane), with its own escape -> <parent>/outside
    <parent>/outside/canary.txt   holds CANARY; must never change nor show up in a response
    <parent>/workspace2/secret.txt

Everything under <parent> except the workspace is snapshotted before and after the run.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

WORKSPACE_ID = "fuzz"
LANE = "lane-a"
# Paths the fuzzers aim at, besides what they generate: real files, links out, the .git dir.
TARGET_PATHS = (
    "README.md",
    "src/app.py",
    "docs/notes.md",
    "unicode-é ✓.txt",
    "inside-link",
    "escape",
    "escape/canary.txt",
    "escape/not-yet.txt",
    "escape-file",
    "dangling",
    "prefix-escape",
    "docs/up",
    "docs/up/outside/canary.txt",
    "docs/up/workspace2/secret.txt",
    ".git/config",
    ".git/hooks/pre-commit",
    "new/dir/file.txt",
)
TARGET_DIRS = ("src", "docs", "escape", "docs/up", "docs/up/outside", ".git")


@dataclass(frozen=True)
class Sandbox:
    parent: Path
    workspace: Path
    canary: Path
    secret: str  # the canary's content: seeing it in a response means a read escaped

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.secret,)


def build(parent: Path) -> Sandbox:
    from livesupport import git_workspace  # tests/ is on sys.path in the suite and fuzz/run.py

    secret = f"CANARY-{uuid.uuid4().hex}"
    outside = parent / "outside"
    outside.mkdir(parents=True)
    canary = outside / "canary.txt"
    canary.write_text(f"{secret}\n")
    sibling = parent / "workspace2"
    sibling.mkdir()
    (sibling / "secret.txt").write_text(f"{secret} (sibling)\n")
    workspace = git_workspace(
        parent / "workspace",
        files={
            "README.md": "# fuzz workspace\nhello fuzz\n",
            "src/app.py": "def main():\n    return 'hello'\n",
            "docs/notes.md": "notes\n" * 50,
            "unicode-é ✓.txt": "ünïcödé ✓\n",
        },
        lanes=(LANE,),
    )
    links = {
        "inside-link": "README.md",
        "escape": str(outside),
        "escape-file": "../outside/canary.txt",
        "dangling": "../outside/not-yet.txt",
        "prefix-escape": "../workspace2/secret.txt",
        "docs/up": "../..",
    }
    for name, target in links.items():
        os.symlink(target, workspace / name)
    os.symlink(str(outside), workspace / ".worktrees" / LANE / "escape")
    return Sandbox(parent=parent, workspace=workspace, canary=canary, secret=secret)
