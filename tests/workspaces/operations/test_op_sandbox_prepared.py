"""Sandboxes prepared before their command (workspaces/operations/prepared.py), with real bwrap.

A prepared sandbox must be what a sandbox started at the call would be: one command each,
only for the key it was started for, no worker secret before or after the hand-off, the
files and directories of the moment of the call, and nothing left when it is not used or
the worker ends. A command can tell which kind it runs in: the sandbox's PID 1 (bwrap) has
the environment bwrap was started with, which for a prepared one is the worker's id alone.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from livesupport import git, wait_until
from sandboxkit import Run, command_runner

from workspaces.operations import prepared
from workspaces.operations.command import OWNER_ENV
from workspaces.operations.prepared import PREPARED_ENV, SandboxKey
from workspaces.runtime.orphans import orphaned_pids
from workspaces.sandbox import MARK_ENV, Limits, Sandbox

ROOT = Path(__file__).resolve().parents[3]
# How many variables the sandbox's PID 1 has: bwrap's own environment.
PID1_ENV = "tr '\\0' '\\n' </proc/1/environ | wc -l"


@pytest.fixture
def boxed(sandbox: Sandbox, repo: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv(OWNER_ENV, f"test-{uuid.uuid4().hex}")
    return command_runner(sandbox, repo)


def _key(sandbox: Sandbox, repo: Path, worktree: str | None = None) -> SandboxKey:
    return SandboxKey(sandbox, str(repo), worktree, True)


def _warm(boxed: Run, key: SandboxKey) -> None:
    """Run one command on ``key`` and wait until the sandboxes it prepared are up."""
    assert boxed("true", worktree=key.worktree)["exitCode"] == 0
    wait_until(lambda: prepared.waiting_for(key) == prepared.AHEAD)


def _ran_prepared(stdout_last_line: str) -> bool:
    # A prepared sandbox's bwrap has the worker's id and the undertaker's mark alone; one
    # started for the call has the command's whole environment.
    return int(stdout_last_line) == 2


def test_a_prepared_sandbox_runs_one_command_and_is_then_no_ones(
    sandbox: Sandbox, repo: Path
) -> None:
    key = _key(sandbox, repo)
    prepared.prepare(key, root=str(repo), env={})
    wait_until(lambda: prepared.waiting_for(key) == prepared.AHEAD)
    first, second = prepared.take(key), prepared.take(key)
    assert first is not None and second is not None and first is not second
    assert prepared.take(key) is None
    env = {"PATH": os.environ["PATH"]}
    assert first.hand_over("echo one > one.txt", cwd=str(repo), env=env)
    with pytest.raises(RuntimeError):
        first.hand_over("echo two > two.txt", cwd=str(repo), env=env)
    assert first.proc.wait(10) == 0
    first.discard()
    second.discard()
    with pytest.raises(RuntimeError):
        second.hand_over("echo two > two.txt", cwd=str(repo), env=env)
    assert (repo / "one.txt").read_text() == "one\n"
    assert not (repo / "two.txt").exists()


def test_each_command_gets_a_sandbox_of_its_own(boxed: Run, sandbox: Sandbox, repo: Path) -> None:
    key = _key(sandbox, repo)
    namespaces = []
    for _ in range(4):
        _warm(boxed, key)
        result = boxed(f"readlink /proc/self/ns/pid /proc/self/ns/mnt; {PID1_ENV}")
        *spaces, pid1 = result["stdout"].split()
        assert _ran_prepared(pid1), result
        namespaces.append(tuple(spaces))
    assert len(set(namespaces)) == 4


def test_a_sandbox_prepared_for_one_lane_never_serves_another(
    boxed: Run, sandbox: Sandbox, repo: Path
) -> None:
    one = _key(sandbox, repo, "one")
    _warm(boxed, one)
    others = [
        _key(sandbox, repo, "two"),
        _key(sandbox, repo),
        dataclasses.replace(one, network=False),
        dataclasses.replace(one, sandbox=dataclasses.replace(sandbox, limits=Limits(7, 0, 0))),
    ]
    for other in others:
        assert prepared.take(other) is None, other
    result = boxed(f"touch ../one/from-two; touch mine; {PID1_ENV}", worktree="two")
    assert not _ran_prepared(result["stdout"].split()[-1])
    assert "Read-only file system" in result["stderr"]
    assert not (repo / ".worktrees" / "one" / "from-two").exists()
    assert (repo / ".worktrees" / "two" / "mine").exists()
    assert prepared.waiting_for(one) == prepared.AHEAD


def test_a_prepared_sandbox_holds_no_worker_secret_and_takes_the_environment_of_the_call(
    boxed: Run, sandbox: Sandbox, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_WORKER_TOKEN", "TOKEN-SECRET")
    monkeypatch.setenv("REDIS_URL", "redis://worker:REDIS-SECRET@127.0.0.1:6379/0")
    _warm(boxed, _key(sandbox, repo))
    # Set after the sandbox was prepared: the call's environment is the one at hand-off.
    monkeypatch.setenv("DATABASE_URL", "postgres://root:DB-SECRET@127.0.0.1/x")
    monkeypatch.setenv("LATE_SETTING", "it's late")
    monkeypatch.setenv("TMPDIR", "/var/tmp/elsewhere")
    result = boxed(f"cat /proc/[0-9]*/environ | tr '\\0' '\\n'; echo; env; {PID1_ENV}")
    assert _ran_prepared(result["stdout"].split()[-1]), result
    assert "SECRET" not in result["stdout"] + result["stderr"]
    lines = result["stdout"].splitlines()
    assert "LATE_SETTING=it's late" in lines
    # The waiting shell's own variable is not the command's.
    command_env = lines[lines.index("") + 1 : -1]
    assert not [line for line in command_env if line.startswith((PREPARED_ENV, MARK_ENV))]
    assert "TMPDIR=/tmp" in command_env
    # The waiting shell's `cd` leaves no OLDPWD of its own.
    assert any(v.startswith("OLDPWD=") for v in command_env) == ("OLDPWD" in os.environ)


def test_a_prepared_sandbox_sees_what_was_written_after_it_came_up(
    boxed: Run, sandbox: Sandbox, repo: Path
) -> None:
    _warm(boxed, _key(sandbox, repo))
    (repo / "late.txt").write_text("written late\n")
    (repo / "late-dir").mkdir()
    (repo / "README.md").write_text("changed\n")
    # The call's directory, too, did not exist when the sandbox came up.
    result = boxed(f"cat ../late.txt ../README.md; pwd; {PID1_ENV}", cwd="late-dir")
    lines = result["stdout"].splitlines()
    assert lines[:3] == ["written late", "changed", str(repo / "late-dir")], result
    assert _ran_prepared(lines[-1]), result


def test_a_lane_added_after_preparing_is_guarded_all_the_same(
    boxed: Run, sandbox: Sandbox, repo: Path
) -> None:
    _warm(boxed, _key(sandbox, repo))
    git(repo, "worktree", "add", "-q", ".worktrees/three", "-b", "three")
    admin = repo / ".git" / "worktrees" / "three"
    before = {name: (admin / name).read_bytes() for name in ("commondir", "gitdir")}
    for name in before:
        result = boxed(f"echo /elsewhere > .git/worktrees/three/{name}")
        assert result["exitCode"] != 0, result
    assert {name: (admin / name).read_bytes() for name in before} == before


def test_a_directory_replaced_after_preparing_is_not_the_one_written(
    boxed: Run, sandbox: Sandbox, repo: Path
) -> None:
    _warm(boxed, _key(sandbox, repo, "one"))
    # What a checkout command could do between two lane calls: the lane writes the shared
    # objects directory, and the one at that path now is another directory.
    objects, aside = repo / ".git" / "objects", repo / ".git" / "objects-aside"
    objects.rename(aside)
    shutil.copytree(aside, objects)
    result = boxed('touch "$(git rev-parse --git-common-dir)/objects/planted"', worktree="one")
    assert result["exitCode"] == 0, result
    assert (objects / "planted").exists()
    assert not (aside / "planted").exists()


def test_a_prepared_sandbox_left_unused_is_torn_down(
    boxed: Run, sandbox: Sandbox, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepared, "IDLE_S", 0.5)
    _warm(boxed, _key(sandbox, repo))
    owner = os.environ[OWNER_ENV]
    # bwrap, its PID 1 and the waiting shell, for each prepared sandbox.
    assert len(orphaned_pids(owner, name=PREPARED_ENV)) >= prepared.AHEAD
    wait_until(lambda: prepared.prepared_count() == 0)
    wait_until(lambda: not orphaned_pids(owner, name=PREPARED_ENV))
    assert not (repo / ".git" / "commondir").exists()


WORKER = """
import sys, time
from workspaces.operations import Confinement, prepared, run_operation
from workspaces.sandbox import worker_sandbox

root, base = sys.argv[1:3]
sandbox = worker_sandbox(base_dir=base, workspace_roots=[root])
request = {"protocolVersion": 1, "operation": "execute_command", "workspaceId": "w",
           "command": "true", "cwd": "", "timeoutMs": 10000, "maxOutputBytes": 100}
run_operation(request, root=root, deadline=time.monotonic() + 20,
              confinement=Confinement(sandbox, root))
key = prepared.SandboxKey(sandbox, root, None, True)
deadline = time.monotonic() + 20
while prepared.waiting_for(key) < prepared.AHEAD and time.monotonic() < deadline:
    time.sleep(0.01)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("ending", ["exit", "SIGKILL"])
def test_no_prepared_sandbox_outlives_its_worker(repo: Path, scratch: Path, ending: str) -> None:
    owner = f"test-{uuid.uuid4().hex}"
    (scratch / "code").mkdir()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'protocol'}", **{OWNER_ENV: owner})
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(repo), str(scratch / "code")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        assert len(orphaned_pids(owner, name=PREPARED_ENV)) >= prepared.AHEAD
        if ending == "exit":
            assert worker.stdin is not None
            worker.stdin.close()
        else:
            worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        wait_until(lambda: not orphaned_pids(owner, name=PREPARED_ENV))
    finally:
        worker.kill()
        worker.wait()
