"""`manage.py runworker` command line (§1): refusals exit non-zero with one line, before the
worker registers; the default slot count; the one-slot warning.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from livesupport import PYTHON, ROOT, ApiServer, git_workspace

from workspaces.models import Worker as WorkerRow
from workspaces.runtime.config import default_slots

pytestmark = pytest.mark.e2e


def runworker(
    env: dict[str, str], api: ApiServer, owner: Any, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            PYTHON,
            "manage.py",
            "runworker",
            "--worker-id",
            owner.worker_id,
            "--token",
            owner.worker_token,
            "--api",
            api.url,
            *args,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runworker_refuses_a_bad_workspace_set_or_slot_count_in_one_line(
    live_env, api, account_factory, tmp_path
):
    owner = account_factory()
    repo = git_workspace(tmp_path / "repo")
    (repo / "sub").mkdir()
    (tmp_path / "alias").symlink_to(repo, target_is_directory=True)
    other = git_workspace(tmp_path / "other")
    # (case, arguments, what the one line must say)
    cases: list[tuple[str, list[str], str]] = [
        ("missing path", ["--workspace", f"a={tmp_path / 'nope'}"], "does not exist"),
        (
            "alias through a symlink",
            ["--workspace", f"a={repo}", "--workspace", f"b={tmp_path / 'alias'}"],
            "same directory",
        ),
        ("nested", ["--workspace", f"a={repo}", "--workspace", f"b={repo / 'sub'}"], "overlap"),
        (
            "nested, inner first",
            ["--workspace", f"b={repo / 'sub'}", "--workspace", f"a={repo}"],
            "overlap",
        ),
        ("slots 0", ["--workspace", f"a={repo}", "--slots", "0"], "--slots must be within 1..64"),
        ("slots 65", ["--workspace", f"a={repo}", "--slots", "65"], "--slots must be within 1..64"),
        ("same id twice", ["--workspace", f"a={repo}", "--workspace", f"a={other}"], "given twice"),
        ("no workspace", [], "at least one --workspace"),
    ]
    # Each refusal costs a Python start-up; run them side by side.
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: runworker(live_env, api, owner, *case[1]), cases))
    for (case, _, reason), proc in zip(cases, done, strict=True):
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        assert proc.returncode != 0, case
        assert len(lines) == 1 and reason in lines[0], (case, lines)
        # The one line names what is wrong, not a traceback.
        assert "Traceback" not in proc.stderr, case
    # Refused before registering: the server never heard of an incarnation.
    assert WorkerRow.objects.get(worker_id=owner.worker_id).incarnation_id == ""


def test_more_than_one_workspace_on_one_slot_logs_a_startup_warning(
    account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    one, two = git_workspace(tmp_path / "one"), git_workspace(tmp_path / "two")
    worker = worker_factory(owner, {"one": one, "two": two}, slots=1)
    assert worker.process is not None
    warning = worker.process.wait_for("share 1 slot")
    assert '"level": "WARNING"' in warning and "2 workspaces" in warning
    assert WorkerRow.objects.get(worker_id=owner.worker_id).slots == 1


def test_slots_default_to_half_the_cpus_between_2_and_4_and_no_warning(
    account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    one, two = git_workspace(tmp_path / "one"), git_workspace(tmp_path / "two")
    worker = worker_factory(owner, {"one": one, "two": two})
    expected = min(4, max(2, (os.cpu_count() or 2) // 2))
    assert default_slots() == expected
    assert worker.process is not None
    assert f"slots {expected}," in worker.process.wait_for("registered: incarnation")
    row = WorkerRow.objects.get(worker_id=owner.worker_id)
    assert (row.requested_slots, row.slots) == (expected, expected)
    assert "share 1 slot" not in worker.process.output()


def test_a_worker_token_of_another_worker_is_refused_in_one_line(
    live_env, api, account_factory, tmp_path
):
    owner, outsider = account_factory(), account_factory()
    repo = git_workspace(tmp_path / "repo")
    proc = subprocess.run(
        [
            PYTHON,
            "manage.py",
            "runworker",
            "--worker-id",
            outsider.worker_id,
            "--token",
            owner.worker_token,
            "--api",
            api.url,
            "--workspace",
            f"repo={repo}",
        ],
        cwd=ROOT,
        env=live_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "registration refused" in proc.stderr
    assert WorkerRow.objects.get(worker_id=outsider.worker_id).incarnation_id == ""
    # The path stays on the worker's machine, even in its own error output.
    assert str(repo) not in proc.stderr
    assert Path(repo).is_dir()


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("refusal", ["closed port", "wrong password"])
def test_a_worker_whose_redis_refuses_it_says_so_in_one_line(
    live_env, api, account_factory, tmp_path, refusal
):
    owner = account_factory()
    repo = git_workspace(tmp_path / "repo")
    if refusal == "closed port":
        url = f"redis://127.0.0.1:{closed_port()}/0"
    else:
        # What a stale credentials file holds once its Redis user's password changed.
        url = "redis://no-such-user:stale-password@127.0.0.1:6379/0"
    env = live_env | {"REDIS_URL": url, "ADMISSION_REDIS_URL": url}
    proc = runworker(env, api, owner, "--workspace", f"repo={repo}")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Redis" in lines[0] and "127.0.0.1" in lines[0]
    assert "stale-password" not in proc.stderr
    # It never stayed registered: it deregistered, or was never listed as online.
    assert not WorkerRow.objects.get(worker_id=owner.worker_id).is_online
