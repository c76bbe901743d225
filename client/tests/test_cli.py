"""Rule 11: the CLI prints the result or the error as JSON and its exit code says whether a
resend is safe. Run in-process through `main(argv)` with a scripted transport.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted import COMMAND_RESULT, READ_RESULT, FakeTime, Script, ok, queue_timeout, typed
from sluice_client.cli import main

GLOBAL = ["--url", "http://sluice.test", "--key", "k"]


class Cli:
    def __init__(self) -> None:
        self.time = FakeTime()
        self.script = Script(self.time)
        self.stdout, self.stderr = io.StringIO(), io.StringIO()

    def __call__(self, *argv: str) -> int:
        return main(
            list(argv),
            transport=self.script.transport(),
            stdout=self.stdout,
            stderr=self.stderr,
            clock=self.time.clock,
            sleep=self.time.sleep,
        )

    def out(self) -> Any:
        return json.loads(self.stdout.getvalue())

    def err(self) -> Any:
        return json.loads(self.stderr.getvalue())

    def body(self, index: int = 0) -> Any:
        return json.loads(self.script.sent[index].body)


@pytest.fixture
def cli() -> Cli:
    return Cli()


def test_a_result_is_printed_as_json_with_exit_0(cli: Cli) -> None:
    cli.script.then(ok())
    code = cli(
        *GLOBAL,
        "--worker",
        "w1",
        "read_file",
        "--workspace",
        "ws",
        "--path",
        "a.txt",
        "--max-lines",
        "5",
    )
    assert code == 0 and cli.out() == READ_RESULT and cli.stderr.getvalue() == ""
    assert cli.body()["maxLines"] == 5
    assert cli.script.sent[0].headers["X-LibreChat-Code-Worker-ID"] == "w1"


def test_a_typed_rejection_exits_2(cli: Cli) -> None:
    cli.script.then(typed(503, "WORKER_OFFLINE"))
    assert cli(*GLOBAL, "read_file", "--workspace", "ws", "--path", "a.txt") == 2
    error = cli.err()
    assert (error["reason"], error["not_started"], error["code"]) == (
        "rejected",
        True,
        "WORKER_OFFLINE",
    )
    assert cli.stdout.getvalue() == ""


def test_exhausted_retries_exit_2(cli: Cli) -> None:
    cli.script.then(queue_timeout()).then(queue_timeout())
    argv = [*GLOBAL, "--max-queue-wait-ms", "1000", "list_files", "--workspace", "ws"]
    assert cli(*argv) == 2
    assert len(cli.script.sent) == 2


def test_an_outcome_that_may_have_run_exits_3(cli: Cli) -> None:
    cli.script.then(typed(504, "ASSIGNMENT_EXPIRED"))
    argv = [
        *GLOBAL,
        "execute_command",
        "--workspace",
        "ws",
        "--command",
        "make",
        "--timeout-ms",
        "1000",
    ]
    assert cli(*argv) == 3
    assert (cli.err()["reason"], cli.err()["not_started"]) == ("timeout", False)
    assert cli.body()["timeoutMs"] == 1000


def test_a_worker_refusal_says_what_the_worker_said_and_not_may_have_run(cli: Cli) -> None:
    cli.script.then(typed(422, "NOT_FOUND"))
    # Nothing was done and the same call would be refused again: exit 4, not "may have run".
    assert cli(*GLOBAL, "read_file", "--workspace", "ws", "--path", "a.txt") == 4
    error = cli.err()
    assert error["said"] == "NOT_FOUND from the script"
    assert error["error"] == (
        "The worker refused the call with NOT_FOUND (HTTP 422): NOT_FOUND from the script. "
        "It did not carry out the operation."
    )
    assert "may have run" not in error["error"]


def test_a_worker_sentence_ending_in_a_full_stop_is_not_doubled(cli: Cli) -> None:
    said = "oldText occurs 2 times in a.txt; it must occur exactly once."
    cli.script.then(httpx.Response(409, json={"error": said, "code": "EDIT_CONFLICT"}))
    argv = [*GLOBAL, "edit_file", "--workspace", "ws", "--path", "a.txt"]
    argv += ["--old", "x", "--new", "y"]
    assert cli(*argv) == 4
    message = cli.err()["error"]
    assert ".." not in message
    assert message.startswith("The worker refused the call with EDIT_CONFLICT (HTTP 409): oldText")


def test_an_unknown_worker_failure_still_says_it_may_have_run(cli: Cli) -> None:
    cli.script.then(typed(502, "WORKER_FAILED"))
    assert cli(*GLOBAL, "read_file", "--workspace", "ws", "--path", "a.txt") == 3
    assert "may have run" in cli.err()["error"]
    assert cli.err()["said"] == "WORKER_FAILED from the script"


def test_an_invalid_result_exits_3_because_the_call_ran(cli: Cli) -> None:
    cli.script.then(ok({**READ_RESULT, "path": "/etc/passwd"}))
    assert cli(*GLOBAL, "read_file", "--workspace", "ws", "--path", "a.txt") == 3
    assert cli.err()["reason"] == "invalid"


@pytest.mark.parametrize(
    "argv",
    [
        [*GLOBAL, "read_file", "--workspace", "ws", "--path", "a.txt", "--max-lines", "0"],
        [*GLOBAL, "read_file", "--workspace", "ws", "--path", "../a.txt"],
        [*GLOBAL, "read_file", "--workspace", "ws"],  # --path missing
        [*GLOBAL, "read_file", "--workspace", "ws", "--path", "a", "--max-lines", "many"],
        [*GLOBAL, "--worker", "no spaces", "read_file", "--workspace", "ws", "--path", "a"],
        [*GLOBAL, "--max-queue-wait-ms", "300001", "read_file", "--workspace", "ws", "--path", "a"],
        ["read_file", "--workspace", "ws", "--path", "a.txt"],  # no URL or key
        [*GLOBAL, "edit_file", "--workspace", "ws", "--path", "a", "--edits", "not json"],
        [*GLOBAL, "delete_everything"],
    ],
)
def test_an_invalid_request_or_command_line_exits_4_and_sends_nothing(
    cli: Cli, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLUICE_URL", raising=False)
    monkeypatch.delenv("SLUICE_API_KEY", raising=False)
    assert cli(*argv) == 4
    assert cli.err()["reason"] == "invalid"
    assert cli.script.sent == []


def test_url_and_key_may_come_from_the_environment(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_URL", "http://sluice.test")
    monkeypatch.setenv("SLUICE_API_KEY", "env-key")
    cli.script.then(ok())
    assert cli("read_file", "--workspace", "ws", "--path", "a.txt") == 0
    assert cli.script.sent[0].headers["Authorization"] == "Bearer env-key"


def test_write_file_reads_its_content_from_a_file(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "content.txt"
    source.write_text("héllo\n", encoding="utf-8")
    result = {
        "protocolVersion": 1,
        "operation": "write_file",
        "workspaceId": "ws",
        "path": "n.txt",
        "created": True,
        "bytesWritten": 7,
    }
    cli.script.then(ok(result))
    argv = [
        *GLOBAL,
        "write_file",
        "--workspace",
        "ws",
        "--path",
        "n.txt",
        "--content-file",
        str(source),
    ]
    assert cli(*argv) == 0
    assert cli.body()["content"] == "héllo\n" and cli.body()["overwrite"] is False


def test_edit_file_builds_a_single_edit_from_old_and_new(cli: Cli) -> None:
    result = {
        "protocolVersion": 1,
        "operation": "edit_file",
        "workspaceId": "ws",
        "path": "a",
        "replacements": 1,
        "bytesWritten": 9,
        "matches": [{"strategy": "exact", "occurrences": 3}],
    }
    cli.script.then(ok(result))
    argv = [
        *GLOBAL,
        "edit_file",
        "--workspace",
        "ws",
        "--path",
        "a",
        "--old",
        "x",
        "--new",
        "y",
        "--replace-all",
    ]
    assert cli(*argv) == 0
    assert cli.body()["edits"] == [{"oldText": "x", "newText": "y", "replaceAll": True}]


def test_execute_command_sends_its_fields(cli: Cli) -> None:
    cli.script.then(ok(COMMAND_RESULT))
    argv = [*GLOBAL, "execute_command", "--workspace", "ws", "--command", "ls -la", "--cwd", "src"]
    assert cli(*argv) == 0
    assert (cli.body()["command"], cli.body()["cwd"]) == ("ls -la", "src")


def test_cancel_prints_the_state_of_the_named_call(cli: Cli) -> None:
    cli.script.then(httpx.Response(200, json={"state": "running"}))
    assert cli(*GLOBAL, "cancel", "call-0000000000000001") == 0
    assert cli.out() == {"state": "running"}
    assert cli.script.sent[0].request.method == "DELETE"


def test_help_exits_0_in_process(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--help") == 0
    assert "execute_command" in capsys.readouterr().out


def test_the_module_runs_as_a_program() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sluice_client", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    assert "read_file" in done.stdout and "--max-queue-wait-ms" in done.stdout
