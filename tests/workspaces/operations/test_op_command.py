"""execute_command: exit status, signals, output caps, timeouts and whole-tree cleanup."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from librechat_rules import command_result_problem

from workspaces.operations import OperationError

Run = Callable[..., dict[str, Any]]
Refuse = Callable[..., OperationError]

MIB = 1024 * 1024


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, waiting for init to reap it) counts as gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _all_gone(pids: list[int], within_s: float = 1.0) -> bool:
    # SIGKILL is delivered at once, but the kernel may need a moment to tear a process down.
    end = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def test_exit_code_and_both_streams_are_reported(run: Run) -> None:
    result = run("execute_command", command="echo out; echo err >&2; exit 3")
    assert result == {
        "protocolVersion": 1,
        "operation": "execute_command",
        "workspaceId": "ws-1",
        "exitCode": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "truncated": False,
        "timedOut": False,
    }


def test_a_command_killed_by_a_signal_reports_the_signal_name(run: Run) -> None:
    result = run("execute_command", command="kill -TERM $$")
    assert (result["exitCode"], result["signal"], result["timedOut"]) == (None, "SIGTERM", False)


def test_stdin_is_empty_and_cwd_is_the_requested_directory(workspace: Path, run: Run) -> None:
    (workspace / "sub").mkdir()
    (workspace / "sub/here.txt").write_text("found")
    result = run("execute_command", command="cat; cat here.txt", cwd="sub")
    assert (result["exitCode"], result["stdout"]) == (0, "found")


def test_timeout_kills_the_whole_process_tree(tmp_path: Path, run: Run) -> None:
    pids = shlex.quote(str(tmp_path / "pids"))
    command = (
        f"sleep 30 & echo $! >> {pids}; "
        f"(sleep 30 & echo $! >> {pids}; sleep 30) & echo $! >> {pids}; "
        f"echo $$ >> {pids}; echo started; sleep 30"
    )
    started = time.monotonic()
    result = run("execute_command", command=command, timeoutMs=700)
    assert time.monotonic() - started < 2
    assert (result["timedOut"], result["exitCode"], result["signal"]) == (True, None, "SIGKILL")
    assert result["stdout"] == "started\n"  # output from before the kill is kept
    recorded = _pids(tmp_path / "pids")
    assert len(recorded) == 4
    assert _all_gone(recorded)


def test_the_deadline_cuts_a_longer_timeout_short(run: Run) -> None:
    started = time.monotonic()
    result = run("execute_command", command="sleep 30", timeoutMs=30_000, timeout_s=0.4)
    assert result["timedOut"] is True
    assert time.monotonic() - started < 1.5


def test_no_time_left_means_the_command_is_not_started(tmp_path: Path, run: Run) -> None:
    with pytest.raises(OperationError) as caught:
        run("execute_command", command=f"touch {shlex.quote(str(tmp_path / 'ran'))}", timeout_s=0)
    assert caught.value.code == "COMMAND_UNAVAILABLE"
    assert not (tmp_path / "ran").exists()


def test_background_job_holding_the_pipes_is_killed_shortly_after_the_leader_exits(
    tmp_path: Path, run: Run
) -> None:
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = run(
        "execute_command", command=f"sleep 30 & echo $! > {shlex.quote(str(pids))}; echo done"
    )
    assert time.monotonic() - started < 1
    assert (result["exitCode"], result["stdout"], result["timedOut"]) == (0, "done\n", False)
    assert _all_gone(_pids(pids))


def test_background_job_with_redirected_output_does_not_outlive_the_call(
    tmp_path: Path, run: Run
) -> None:
    pids = tmp_path / "pids"
    result = run(
        "execute_command", command=f"sleep 30 >/dev/null 2>&1 & echo $! > {shlex.quote(str(pids))}"
    )
    assert result["exitCode"] == 0
    assert _all_gone(_pids(pids))


def test_a_leader_that_closes_its_pipes_still_runs_to_completion(run: Run) -> None:
    started = time.monotonic()
    result = run("execute_command", command="exec >/dev/null 2>&1; sleep 0.3; exit 4")
    assert result["exitCode"] == 4
    assert time.monotonic() - started >= 0.3


def test_output_over_the_cap_is_truncated_and_the_command_still_finishes(run: Run) -> None:
    result = run(
        "execute_command", command="head -c 2097152 /dev/zero | tr '\\0' a", maxOutputBytes=MIB
    )
    assert (result["exitCode"], result["truncated"], result["timedOut"]) == (0, True, False)
    assert result["stdout"] == "a" * MIB


def test_both_streams_are_drained_at_once_so_a_full_stderr_pipe_cannot_block(run: Run) -> None:
    command = "head -c 2097152 /dev/zero | tr '\\0' e >&2; head -c 2097152 /dev/zero | tr '\\0' o"
    result = run("execute_command", command=command, maxOutputBytes=1024, timeoutMs=5000)
    assert (result["exitCode"], result["timedOut"], result["truncated"]) == (0, False, True)
    # One budget for both streams: stderr, written first, took all of it.
    assert (result["stdout"], result["stderr"]) == ("", "e" * 1024)


def test_stdout_and_stderr_share_one_budget_counted_in_utf8_as_sent(run: Run) -> None:
    result = run("execute_command", command="printf abc; printf defg >&2", maxOutputBytes=5)
    assert command_result_problem({"maxOutputBytes": 5}, result) is None
    assert len(result["stdout"].encode()) + len(result["stderr"].encode()) == 5
    assert result["truncated"] is True
    # Invalid bytes decode to U+FFFD, three bytes each: the text is fitted again.
    binary = run("execute_command", command="printf '\\377\\377\\377\\377'", maxOutputBytes=4)
    assert command_result_problem({"maxOutputBytes": 4}, binary) is None
    assert binary["truncated"] is True


def test_output_exactly_at_the_cap_is_not_truncated(run: Run) -> None:
    result = run("execute_command", command="printf abcd", maxOutputBytes=4)
    assert (result["stdout"], result["truncated"]) == ("abcd", False)


def test_a_cut_inside_a_multibyte_character_drops_the_partial_character(run: Run) -> None:
    result = run("execute_command", command="printf 'ééé'", maxOutputBytes=3)
    assert (result["stdout"], result["truncated"]) == ("é", True)


def test_invalid_utf8_output_is_replaced(run: Run) -> None:
    assert run("execute_command", command="printf 'a\\377b'")["stdout"] == "a\ufffdb"


def test_cwd_that_is_a_file_or_missing_is_refused(workspace: Path, refuse: Refuse) -> None:
    (workspace / "file").write_text("x")
    assert refuse("execute_command", command="true", cwd="file").code == "INVALID_PATH"
    assert refuse("execute_command", command="true", cwd="missing").code == "NOT_FOUND"
