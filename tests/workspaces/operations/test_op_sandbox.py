"""execute_command in the bubblewrap sandbox (contract §4.4), with a real bwrap and real files.

Each attack runs sandboxed and must fail; where it is cheap, the same probe runs unconfined
first to show it would have worked, so a sandbox that stopped confining fails the test. The
"worker" here is the test process itself: its pid, environment and files are what a command
must not reach. Its code base is a fake one with a ``var/`` secret. Everything lives under
/var/tmp, not /tmp: the sandbox's private /tmp would hide a /tmp path whatever else it did.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from livesupport import git, git_workspace
from sandboxkit import Run, command_runner

from workspaces.operations import Confinement, run_operation
from workspaces.sandbox import MARK_ENV, Limits, Sandbox, worker_sandbox

COMMIT = "git -c user.email=t@example.com -c user.name=t commit -q"


@pytest.fixture
def scratch() -> Iterator[Path]:
    where = "/var/tmp" if os.path.isdir("/var/tmp") else None
    path = Path(os.path.realpath(tempfile.mkdtemp(prefix="sluice-sandbox-", dir=where)))
    assert not str(path).startswith("/tmp/"), "the probes need a directory outside /tmp"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def base_dir(scratch: Path) -> Path:
    base = scratch / "sluice"
    (base / "var").mkdir(parents=True)
    (base / "var" / "local-secret-key").write_text("BASE-DIR-SECRET\n")
    return base


@pytest.fixture
def credentials(scratch: Path) -> Path:
    (scratch / "etc").mkdir()
    path = scratch / "etc" / "worker-credentials.json"
    path.write_text('{"token": "CREDENTIAL-SECRET"}\n')
    return path


@pytest.fixture
def repo(scratch: Path) -> Path:
    root = git_workspace(scratch / "repo", lanes=("one", "two"))
    return Path(os.path.realpath(root))


@pytest.fixture
def other(scratch: Path) -> Path:
    """Another workspace of the same worker."""
    root = scratch / "other"
    root.mkdir()
    (root / "theirs.txt").write_text("OTHER-WORKSPACE\n")
    return Path(os.path.realpath(root))


def _sandbox(
    base_dir: Path, credentials: Path, *roots: Path, limits: Limits | None = None
) -> Sandbox:
    # The interpreter's directory joins PATH, so python3 is there inside even when it lives
    # under a hidden home (pyenv).
    path_env = f"{os.environ.get('PATH', '')}:{os.path.dirname(os.path.realpath(sys.executable))}"
    return worker_sandbox(
        base_dir=str(base_dir),
        workspace_roots=[str(r) for r in roots],
        credential_files=[str(credentials)],
        path_env=path_env,
        limits=limits,
    )


@pytest.fixture
def sandbox(base_dir: Path, credentials: Path, repo: Path, other: Path) -> Sandbox:
    return _sandbox(base_dir, credentials, repo, other)


@pytest.fixture
def boxed(sandbox: Sandbox, repo: Path) -> Run:
    return command_runner(sandbox, repo)


@pytest.fixture
def bare(repo: Path) -> Run:
    return command_runner(None, repo)


def _host_pids_running(token: str) -> list[int]:
    """Host processes whose command line holds ``token`` (seen from outside any sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def test_the_workers_environment_and_command_line_are_not_readable(boxed: Run, bare: Run) -> None:
    me = os.getpid()
    probe = f"cat /proc/{me}/environ /proc/{me}/cmdline"
    assert "PATH=" in bare(probe)["stdout"]
    result = boxed(probe)
    assert result["exitCode"] != 0
    assert result["stdout"] == ""
    assert "No such file" in result["stderr"]


def test_the_undertakers_mark_is_on_bwrap_and_not_on_the_command(
    sandbox: Sandbox, repo: Path
) -> None:
    request = {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "repo",
        "command": "tr '\\0' '\\n' </proc/1/environ; echo; env",
        "cwd": "",
        "timeoutMs": 30_000,
        "maxOutputBytes": 256 * 1024,
    }
    result = run_operation(
        request,
        root=str(repo),
        deadline=time.monotonic() + 60,
        confinement=Confinement(sandbox, str(repo), prepared=False),
    )
    lines = str(result["stdout"]).splitlines()
    bwrap, command = lines[: lines.index("")], lines[lines.index("") + 1 :]
    assert [line for line in bwrap if line.startswith(f"{MARK_ENV}=")]
    assert not [line for line in command if line.startswith(f"{MARK_ENV}=")]


def test_ps_and_proc_show_only_the_calls_own_processes(boxed: Run, bare: Run) -> None:
    assert str(os.getpid()) in bare("ls /proc")["stdout"].split()
    result = boxed("ps -eo pid=,comm=")
    commands = {line.split()[1] for line in result["stdout"].splitlines()}
    assert result["exitCode"] == 0
    # bwrap's PID 1, the shell, and ps itself; the worker and the host's processes are absent.
    assert commands <= {"bwrap", "sh", "ps"}, commands


def test_the_worker_code_base_and_its_var_files_are_hidden(
    boxed: Run, bare: Run, base_dir: Path
) -> None:
    probe = f"cat {base_dir}/var/local-secret-key; ls -A {base_dir}"
    assert "BASE-DIR-SECRET" in bare(probe)["stdout"]
    result = boxed(probe)
    assert "BASE-DIR-SECRET" not in result["stdout"] + result["stderr"]
    assert result["stdout"] == ""


def test_a_credentials_file_the_worker_names_is_hidden_with_its_directory(
    boxed: Run, bare: Run, credentials: Path
) -> None:
    assert "CREDENTIAL-SECRET" in bare(f"cat {credentials}")["stdout"]
    result = boxed(f"ls -A {credentials.parent}; cat {credentials}")
    assert result["stdout"] == ""
    assert "No such file" in result["stderr"]


def test_a_command_holds_no_capability_so_it_cannot_unmount_what_hides_a_secret(
    boxed: Run, base_dir: Path, repo: Path, scratch: Path
) -> None:
    # A worker run as root (a container, this CI) must not hand root's capabilities into the
    # sandbox: with CAP_SYS_ADMIN a command unmounts the tmpfs that hides the code base, or
    # remounts / read-write, and reaches everything the sandbox hides.
    caps = boxed("grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status")["stdout"]
    assert {line.split()[1] for line in caps.splitlines()} == {"0000000000000000"}, caps
    escape = boxed(
        f"umount -l {base_dir} 2>&1; umount -l {base_dir.parent} 2>&1; "
        f"mount -o remount,rw,bind / 2>&1; cat {base_dir}/var/local-secret-key; "
        f"echo x > {scratch}/escaped"
    )
    assert "BASE-DIR-SECRET" not in escape["stdout"] + escape["stderr"]
    assert not (scratch / "escaped").exists()


def test_other_workspaces_of_the_worker_are_hidden_and_unwritable(boxed: Run, other: Path) -> None:
    result = boxed(f"ls -A {other}; touch {other}/planted")
    assert result["stdout"] == ""
    assert result["exitCode"] != 0
    assert sorted(p.name for p in other.iterdir()) == ["theirs.txt"]


def test_writing_outside_the_workspace_fails(boxed: Run, bare: Run, scratch: Path) -> None:
    target = scratch / "outside.txt"
    assert bare(f"echo x > {target} && rm {target}")["exitCode"] == 0
    result = boxed(f"echo x > {target}")
    assert result["exitCode"] != 0
    assert "Read-only file system" in result["stderr"]
    assert not target.exists()


def test_a_checkout_call_writes_its_workspace_and_commits(boxed: Run, repo: Path) -> None:
    result = boxed(
        f"echo new > added.txt && git add added.txt && {COMMIT} -m add && git status --short"
    )
    assert result["exitCode"] == 0, result["stderr"]
    assert git(repo, "log", "-1", "--format=%s").strip() == "add"
    assert (repo / "added.txt").read_text() == "new\n"


def test_a_lane_call_commits_in_its_lane_but_cannot_write_the_checkout_or_a_sibling(
    boxed: Run, bare: Run, repo: Path
) -> None:
    escape = "cd ../.. && echo x > from-lane.txt; echo x > .worktrees/two/from-lane.txt"
    # Unconfined, a lane command walks out of its lane and writes both.
    assert bare(escape, worktree="one")["exitCode"] == 0
    for planted in (repo / "from-lane.txt", repo / ".worktrees" / "two" / "from-lane.txt"):
        assert planted.exists()
        planted.unlink()
    result = boxed(escape, worktree="one")
    assert result["stderr"].count("Read-only file system") == 2, result["stderr"]
    assert not (repo / "from-lane.txt").exists()
    assert not (repo / ".worktrees" / "two" / "from-lane.txt").exists()

    commit = (
        f"echo lane > lane.txt && git add lane.txt && {COMMIT} -m in-lane && git status --short"
    )
    done = boxed(commit, worktree="one")
    assert (done["exitCode"], done["stdout"]) == (0, ""), done["stderr"]
    assert git(repo, "log", "-1", "--format=%s", "one").strip() == "in-lane"
    assert git(repo, "log", "-1", "--format=%s", "main").strip() == "initial"
    assert git(repo, "status", "--short") == "?? .worktrees/\n"


def test_a_lane_commit_works_when_the_branch_refs_are_packed(boxed: Run, repo: Path) -> None:
    # A fresh clone keeps its branches in packed-refs, which a lane may not rewrite; git
    # writes the moved branch as a loose ref in refs/ instead.
    git(repo, "pack-refs", "--all")
    done = boxed(f"echo lane > lane.txt && git add lane.txt && {COMMIT} -m packed", worktree="two")
    assert done["exitCode"] == 0, done["stderr"]
    assert git(repo, "log", "-1", "--format=%s", "two").strip() == "packed"


def test_python_venv_and_a_c_compiler_work_inside(boxed: Run, repo: Path) -> None:
    python = os.path.realpath(sys.executable)
    # Without pip: ensurepip alone takes seconds, and a venv's own interpreter is the point.
    venv = boxed(f"{python} -m venv --without-pip .venv && .venv/bin/python -c 'print(6 * 7)'")
    assert (venv["exitCode"], venv["stdout"]) == (0, "42\n"), venv["stderr"]
    assert (repo / ".venv" / "pyvenv.cfg").exists()
    if not any(os.access(os.path.join(d, "cc"), os.X_OK) for d in os.environ["PATH"].split(":")):
        pytest.skip("no cc on this machine")
    cc = boxed("printf 'int main(void){return 5;}' > m.c && cc m.c -o m && ./m")
    assert cc["exitCode"] == 5, cc["stderr"]


def test_a_setsid_job_ends_with_its_call(boxed: Run, bare: Run) -> None:
    token = f"3000.{uuid.uuid4().int % 10**9}"
    # Unconfined, a job in a session of its own survives the call's group kill.
    bare(f"setsid -f sleep {token}")
    escaped = _host_pids_running(token)
    try:
        assert escaped
    finally:
        for pid in escaped:
            os.kill(pid, 9)
    token = f"3000.{uuid.uuid4().int % 10**9}"
    started = time.monotonic()
    result = boxed(f"setsid -f sleep {token}; sh -c 'sleep {token} &' ; echo $? > started")
    assert result["exitCode"] == 0
    assert time.monotonic() - started < 5
    # The kernel tears the namespace down as bwrap's PID 1 exits: nothing is left to find.
    deadline = time.monotonic() + 2
    while _host_pids_running(token):
        assert time.monotonic() < deadline, "a sandboxed job outlived its call"
        time.sleep(0.01)


def test_a_timeout_still_ends_the_call_and_everything_in_it(boxed: Run) -> None:
    token = f"3000.{uuid.uuid4().int % 10**9}"
    started = time.monotonic()
    result = boxed(f"setsid -f sleep {token}; sleep {token}", timeoutMs=500)
    assert (result["timedOut"], result["exitCode"], result["signal"]) == (True, None, "SIGKILL")
    assert time.monotonic() - started < 3
    deadline = time.monotonic() + 2
    while _host_pids_running(token):
        assert time.monotonic() < deadline, "a sandboxed job outlived its timeout"
        time.sleep(0.01)


def test_tmp_and_home_are_private_to_each_call(boxed: Run) -> None:
    marker = f"sandbox-{uuid.uuid4().hex}"
    first = boxed(f"echo x > /tmp/{marker} && echo y > ~/{marker} && ls /tmp")
    assert (first["exitCode"], first["stdout"]) == (0, f"{marker}\n"), first["stderr"]
    assert not Path("/tmp", marker).exists()
    second = boxed(f"test -e /tmp/{marker} || test -e ~/{marker}")
    assert second["exitCode"] == 1


def test_a_workspace_without_network_cannot_connect(
    sandbox: Sandbox, repo: Path, listener: int
) -> None:
    python = os.path.realpath(sys.executable)
    connect = (
        f"{python} -c \"import socket; socket.create_connection(('127.0.0.1', {listener}), 2)\""
    )
    assert command_runner(sandbox, repo, network=True)(connect)["exitCode"] == 0
    offline = command_runner(sandbox, repo, network=False)(connect)
    assert offline["exitCode"] == 1
    assert "ConnectionRefusedError" in offline["stderr"]


def test_per_call_limits_apply(base_dir: Path, credentials: Path, repo: Path) -> None:
    limits = Limits(max_processes=64, max_file_bytes=1 << 20, max_address_space_bytes=1 << 30)
    run = command_runner(_sandbox(base_dir, credentials, repo, limits=limits), repo)
    reported = run("ulimit -p; ulimit -f; ulimit -v")["stdout"].split()
    # dash reports the file limit in 512-byte blocks and address space in KiB.
    assert reported == ["64", str((1 << 20) // 512), str((1 << 30) // 1024)]
    big = run("head -c 2000000 /dev/zero > big.bin")
    assert big["exitCode"] != 0
    assert (repo / "big.bin").stat().st_size <= 1 << 20


def test_a_signal_comes_back_as_128_plus_its_number(boxed: Run) -> None:
    # bwrap folds a signal into its exit status as a shell does (docs/workers.md).
    result = boxed("kill -TERM $$")
    assert (result["exitCode"], result.get("signal"), result["timedOut"]) == (143, None, False)


def test_workspaces_inside_the_hidden_code_base_still_run_as_make_run_lays_them_out(
    base_dir: Path, credentials: Path
) -> None:
    # make run keeps its demo checkouts under var/demo/ of the checkout, which the sandbox
    # hides: each call's own workspace is bound back over the hidden tree, its sibling is not.
    app = git_workspace(base_dir / "var" / "demo" / "app")
    docs = git_workspace(base_dir / "var" / "demo" / "docs")
    (docs / "docs-only.txt").write_text("DOCS-ONLY\n")
    sandbox = _sandbox(base_dir, credentials, app, docs)
    run = command_runner(sandbox, Path(os.path.realpath(app)))
    result = run(
        "touch made-here && ls ../docs 2>&1; cat ../../local-secret-key 2>&1;"
        " touch ../../planted 2>&1; git status --short"
    )
    assert result["exitCode"] == 0, result
    assert (app / "made-here").exists()
    assert "DOCS-ONLY" not in result["stdout"] and "docs-only" not in result["stdout"]
    assert "BASE-DIR-SECRET" not in result["stdout"]
    assert not (base_dir / "var" / "planted").exists()
    assert "made-here" in result["stdout"]


def test_a_shared_directory_is_writable_to_every_call_and_nothing_else_is(
    base_dir: Path, credentials: Path, repo: Path, scratch: Path
) -> None:
    cache = scratch / "cache"
    cache.mkdir()
    sandbox = worker_sandbox(
        base_dir=str(base_dir),
        workspace_roots=[str(repo)],
        credential_files=[str(credentials)],
        shared_dirs=[str(cache)],
    )
    run = command_runner(sandbox, repo)
    assert run(f"echo warm > {cache}/entry")["exitCode"] == 0
    assert run(f"cat {cache}/entry")["stdout"] == "warm\n"
    assert (cache / "entry").read_text() == "warm\n"
    assert run(f"touch {scratch}/beside-the-cache")["exitCode"] != 0
    assert not (scratch / "beside-the-cache").exists()


def test_another_workspace_inside_a_shared_directory_stays_hidden(
    base_dir: Path, credentials: Path, scratch: Path
) -> None:
    # The e2e harness shares a test's tmp_path, where that test's workspaces live too.
    shared = scratch / "shared"
    mine = git_workspace(shared / "mine")
    theirs = git_workspace(shared / "theirs")
    (theirs / "theirs.txt").write_text("THEIRS\n")
    sandbox = worker_sandbox(
        base_dir=str(base_dir),
        workspace_roots=[str(mine), str(theirs)],
        credential_files=[str(credentials)],
        shared_dirs=[str(shared)],
    )
    run = command_runner(sandbox, Path(os.path.realpath(mine)))
    result = run(f"echo log >> {shared}/log; cat {theirs}/theirs.txt; touch {theirs}/planted")
    assert (shared / "log").read_text() == "log\n"
    assert "THEIRS" not in result["stdout"]
    assert not (theirs / "planted").exists()
