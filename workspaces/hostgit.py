"""git as the worker (and its scripts) runs it on the host: nothing a repository says runs.

A workspace's repository is written by agents' commands. The sandbox keeps them from changing
what git executes (workspaces/sandbox.py), and every git the worker's own code starts also
turns off the two ways a repository makes git run a program by itself, whatever its
configuration says: hooks (``core.hooksPath`` pointed at an empty place) and the filesystem
monitor (``core.fsmonitor``). An inherited ``GIT_*`` variable (``GIT_DIR``, ``GIT_CONFIG_*``,
``GIT_EXEC_PATH``) could send git to another repository or configuration: none is passed on.
The system configuration (/etc/gitconfig) stays: no sandboxed command can write it, and a
deployment may keep ``safe.directory`` there.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

# Command-line configuration outranks every configuration file.
SAFE_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def git_argv(*args: str) -> list[str]:
    """``git`` with hooks and the filesystem monitor off, then ``args``."""
    return ["git", *SAFE_CONFIG, *args]


def git_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the worker's environment by default) without any ``GIT_*`` variable, and
    with git's prompts off: no one is there to answer them."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("GIT_")
    }
    env["GIT_TERMINAL_PROMPT"] = "0"
    return env


def run_git(cwd: str | Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``git args`` in ``cwd`` as above, capturing its text output."""
    return subprocess.run(
        git_argv(*args),
        cwd=cwd,
        env=git_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=check,
    )
