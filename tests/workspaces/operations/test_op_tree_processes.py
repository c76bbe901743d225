"""search_text and list_files in the worker's walking processes: the same answers as in the
slot's thread, and a walk that outlives its call stopped (workspaces/operations/treeprocs.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from livesupport import pid_alive, wait_until
from sluice_protocol import validate_request

from workspaces.operations import OperationError, TreeProcesses, run_operation
from workspaces.operations.treeprocs import GRACE_S


@pytest.fixture
def walkers() -> Iterator[TreeProcesses]:
    procs = TreeProcesses(2)
    yield procs
    procs.close()


def _search(**fields: object) -> dict[str, object]:
    return validate_request(
        {"protocolVersion": 1, "operation": "search_text", "workspaceId": "w", **fields}
    )


def _list(**fields: object) -> dict[str, object]:
    return validate_request(
        {"protocolVersion": 1, "operation": "list_files", "workspaceId": "w", **fields}
    )


def _tree(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src/a.txt").write_text("one needle\nnone\n")
    (root / "src/b.txt").write_text("needle needle\n")
    (root / "bin.dat").write_bytes(b"needle\x00")
    (root / "caf\u00e9.txt").write_text("needle \u2603\n")
    # A name that is not UTF-8: skipped alike, and nothing on the pipe chokes on it.
    with open(os.path.join(os.fsencode(root), b"\xff.txt"), "wb") as f:
        f.write(b"needle\n")


def test_a_search_in_a_process_answers_what_one_in_the_thread_does(
    tmp_path: Path, walkers: TreeProcesses
) -> None:
    _tree(tmp_path)
    for request in (
        _search(query="needle"),
        _search(query="needle", maxResults=1),
        _search(query="needle", path="src"),
        _search(query="\u2603"),
        _list(),
        _list(path="src"),
        _list(maxResults=2),
    ):
        here = run_operation(request, root=str(tmp_path), deadline=time.monotonic() + 30)
        there = run_operation(
            request, root=str(tmp_path), deadline=time.monotonic() + 30, walkers=walkers
        )
        assert there == here
        assert here.get("matches") or here.get("paths")


def test_refusals_come_back_as_the_same_typed_errors(
    tmp_path: Path, walkers: TreeProcesses
) -> None:
    _tree(tmp_path)
    for request, code in (
        (_search(query="needle", path="missing"), None),
        (_search(query="needle"), "SEARCH_TIMEOUT"),
        (_list(path="missing"), None),
        (_list(), "LIST_TIMEOUT"),
    ):
        deadline = time.monotonic() + (30 if code is None else -1)
        with pytest.raises(OperationError) as here:
            run_operation(request, root=str(tmp_path), deadline=deadline)
        with pytest.raises(OperationError) as there:
            run_operation(request, root=str(tmp_path), deadline=deadline, walkers=walkers)
        assert (there.value.code, there.value.message) == (here.value.code, here.value.message)
        assert code is None or there.value.code == code


@pytest.mark.parametrize("operation", ["search_text", "list_files"])
def test_a_walk_past_its_deadline_is_stopped_and_its_process_replaced(
    tmp_path: Path, walkers: TreeProcesses, operation: str
) -> None:
    request, code = {
        "search_text": (_search(query="needle"), "SEARCH_TIMEOUT"),
        "list_files": (_list(), "LIST_TIMEOUT"),
    }[operation]
    _tree(tmp_path)
    children = set(walkers._children)
    # Both children stopped: whichever the call takes cannot answer.
    for child in children:
        os.kill(child.pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(OperationError) as refused:
        walkers.run(request, root=str(tmp_path), deadline=started + 0.2)
    assert refused.value.code == code
    assert time.monotonic() - started >= 0.2 + GRACE_S
    killed = children - walkers._children
    assert len(killed) == 1 and all(c.poll() is not None for c in killed)
    for child in children & walkers._children:
        os.kill(child.pid, signal.SIGCONT)
    # The replacement (and the other child) answer the next calls.
    for _ in range(2):
        answer = walkers.run(request, root=str(tmp_path), deadline=time.monotonic() + 30)
        assert answer.get("matches") or answer.get("paths")


def test_a_dead_child_is_replaced_before_it_is_given_a_call(
    tmp_path: Path, walkers: TreeProcesses
) -> None:
    _tree(tmp_path)
    for child in list(walkers._children):
        child.kill()
        child.wait()
    for _ in range(3):
        answer = walkers.run(
            _search(query="needle"), root=str(tmp_path), deadline=time.monotonic() + 30
        )
        assert answer["matches"]


def test_closing_ends_every_child_and_later_calls_are_refused(tmp_path: Path) -> None:
    walkers = TreeProcesses(2)
    children = list(walkers._children)
    walkers.close()
    assert all(child.poll() is not None for child in children)
    with pytest.raises(OperationError) as refused:
        walkers.run(_search(query="x"), root=str(tmp_path), deadline=time.monotonic() + 30)
    assert refused.value.code == "READ_UNAVAILABLE"


def test_a_child_is_not_counted_among_what_commands_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SLUICE_COMMAND_OF", "w1")
    walkers = TreeProcesses(1)
    try:
        (child,) = walkers._children
        environ = Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith(b"SLUICE_COMMAND_OF=") for v in environ)
    finally:
        walkers.close()


def test_a_killed_worker_leaves_no_search_process_behind() -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from workspaces.operations import TreeProcesses\n"
            "procs = TreeProcesses(2)\n"
            "print(' '.join(str(c.pid) for c in procs._children), flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert worker.stdout is not None
    children = [int(pid) for pid in worker.stdout.readline().split()]
    assert len(children) == 2
    worker.kill()
    worker.wait()

    wait_until(lambda: not any(pid_alive(pid) for pid in children))
