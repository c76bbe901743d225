"""Every operator command's `--help` (and `manage.py help X`) works with nothing running: no
database, no Redis, no SECRET_KEY. Each runs as a fresh process, since the point is how a new
process reads its environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from livesupport import ROOT

COMMANDS = [
    "bootstrap",
    "set_policy",
    "prune_completions",
    "drain_completions",
    "contention_report",
    "runworker",
]


def closed_port() -> int:
    """A port nothing listens on: bound, then let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shell_env(**extra: str) -> dict[str, str]:
    """A shell that set none of Sluice's variables (and is not a pytest session)."""
    keep = {"PATH", "HOME", "LANG", "TMPDIR"}
    return {k: v for k, v in os.environ.items() if k in keep} | extra


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_operator_commands_help_works_with_nothing_running() -> None:
    port = closed_port()
    # Nothing running at the URLs given, and no SECRET_KEY.
    env = shell_env(
        DATABASE_URL=f"postgres://root@127.0.0.1:{port}/sluice",
        REDIS_URL=f"redis://127.0.0.1:{port}/0",
    )
    asks = [[command, "--help"] for command in COMMANDS] + [["help", "bootstrap"]]
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(lambda args: run(args, env), asks))
    for args, done in zip(asks, answers, strict=True):
        assert done.returncode == 0, (args, done.stderr)
        name = args[1] if args[0] == "help" else args[0]
        assert done.stdout.startswith(f"usage: manage.py {name} "), (args, done.stdout)
    # bootstrap's help says what it does to an existing worker's token.
    assert "--rotate-worker-token" in answers[0].stdout
    assert "keeps its token" in " ".join(answers[0].stdout.split())


def test_help_works_without_any_setting() -> None:
    done = run(["set_policy", "-h"], shell_env())
    assert done.returncode == 0, done.stderr
    assert "--show" in done.stdout


def test_a_command_that_is_not_asking_for_help_still_refuses_in_one_line() -> None:
    done = run(["set_policy", "--show"], shell_env())
    assert done.returncode != 0
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "SECRET_KEY" in done.stderr
