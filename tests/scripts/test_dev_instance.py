"""`make run` and the operator commands beside it, as real processes in a copy of the checkout.

The copy has a var/ of its own, so these runs never meet a developer's `make run` in this
checkout. They use the machine's Postgres (a throwaway database) and Redis (a key prefix of
their own) through DATABASE_URL / REDIS_URL, which is what `make run` does when they are set;
the operator commands get neither and no PYTEST_VERSION, so they find the instance exactly as
an operator's shell would: through var/run/env, or not at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from django.conf import settings
from livesupport import PYTHON, ROOT, Process, free_port, start_api, wait_until
from psycopg.conninfo import make_conninfo

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SERVER_ENV = (
    "DATABASE_URL",
    "REDIS_URL",
    "ADMISSION_REDIS_URL",
    "SLUICE_LOCAL_SECRET",
    "SECRET_KEY",
)


def admin_url(dbname: str) -> str:
    db = settings.DATABASES["default"]
    return make_conninfo(
        host=db["HOST"],
        port=db["PORT"] or "5432",
        user=db["USER"],
        password=db["PASSWORD"],
        dbname=dbname,
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """This checkout's tracked files (as they are on disk) in a directory of their own."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    copy = tmp_path / "checkout"
    for name in filter(None, (f.decode() for f in files)):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


@pytest.fixture
def database() -> Iterator[str]:
    name = f"test_devrun_{uuid.uuid4().hex[:8]}"
    conn_args = admin_url("postgres")
    with psycopg.connect(conn_args, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(conn_args, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def shell_env(**extra: str) -> dict[str, str]:
    """An operator's shell: no server URLs, no test markers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in SERVER_ENV and not k.startswith("PYTEST") and k != "DJANGO_SETTINGS_MODULE"
    }
    env.update(extra)
    return env


def make_run_env(database: str, port: int) -> dict[str, str]:
    db = settings.DATABASES["default"]
    return shell_env(
        PYTHONUNBUFFERED="1",
        SLUICE_LOCAL_SECRET="1",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{database}",
        REDIS_URL=settings.REDIS_URL,
        SLUICE_REDIS_PREFIX=f"test-devrun-{uuid.uuid4().hex[:8]}:",
        # As in the test session: no ACL users on the machine's shared Redis.
        SLUICE_WORKER_REDIS_ACL="off",
        PORT=str(port),
        # A policy variable; the stored row starts from it and later differs from it.
        WORKER_QUEUE_LIMIT="16",
    )


def make_run(checkout: Path, database: str, port: int, name: str) -> Process:
    env = make_run_env(database, port)
    return Process([PYTHON, "-m", "scripts.dev"], env, name, cwd=checkout)


def operator(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=checkout,
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def stored_queue_limits(database: str) -> tuple[int, list[tuple[str, int | None]]]:
    with psycopg.connect(admin_url(database)) as conn:
        row = conn.execute("SELECT worker_queue_limit FROM admission_admissionpolicy").fetchone()
        overrides = conn.execute(
            "SELECT t.name, o.worker_queue_limit FROM admission_policyoverride o "
            "JOIN workspaces_tenant t ON t.id = o.tenant_id"
        ).fetchall()
    assert row is not None
    return int(row[0]), [(str(n), v) for n, v in overrides]


def demo_key(run: Process) -> str:
    match = re.search(r"Bearer (slk_[A-Za-z0-9_\-]+)", run.output())
    assert match, run.output()
    return match[1]


def stop(run: Process) -> None:
    run.signal(signal.SIGINT)
    assert run.proc.wait(timeout=90) == 0, run.output()


def test_operator_commands_reach_the_running_instance_and_a_second_start_refuses(
    checkout: Path, database: str
) -> None:
    port = free_port()
    first = make_run(checkout, database, port, "make-run")
    try:
        first.wait_for("Sluice is running", timeout_s=180)
        run_env = checkout / "var" / "run" / "env"
        assert stat.S_IMODE(run_env.stat().st_mode) == 0o600
        assert f"/{database}" in run_env.read_text()
        # The banner names the URLs, and the API's per-call JSON lines stay out of the terminal.
        assert f"/{database}" in first.wait_for("Database:")
        assert "Workspace tool request completed" not in first.output()
        # /metrics takes the token the banner points at, and nothing from loopback without it.
        assert "var/metrics-token" in first.wait_for("Metrics:")
        token_file = checkout / "var" / "metrics-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        scrape = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(scrape, timeout=10).status_code == 401
        bearer = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert httpx.get(scrape, headers=bearer, timeout=10).status_code == 200
        # The demo call's row line is logged once its response is closed, a moment after the
        # answer that lets the banner print: wait for it in the API's log file.
        api_log = checkout / "var" / "log" / "api.log"
        wait_until(lambda: "Workspace tool request completed" in api_log.read_text(), timeout_s=15)

        second = make_run(checkout, database, free_port(), "second-make-run")
        assert second.proc.wait(timeout=60) == 1
        assert f"already running in this checkout (pid {first.proc.pid})" in second.output()
        # It started nothing, so it says only that (no "shutting down", no "stopped").
        assert "shutting down" not in second.output() and "stopped" not in second.output()
        # ... and it stopped none of the first run's processes.
        assert first.alive()
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200

        # Operator commands use the run's Redis keys, not the default prefix's.
        seen = operator(
            checkout,
            "shell",
            "-c",
            "from django.conf import settings; print(settings.REDIS_KEY_PREFIX)",
        )
        assert seen.stdout.splitlines()[-1].startswith("test-devrun-"), seen.stderr
        done = operator(checkout, "set_policy", "WORKER_QUEUE_LIMIT=7")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "WORKER_QUEUE_LIMIT=7"
        done = operator(checkout, "set_policy", "--tenant", "demo", "WORKER_QUEUE_LIMIT=3")
        assert done.returncode == 0, done.stderr
        assert stored_queue_limits(database) == (7, [("demo", 3)])
        key = demo_key(first)
    finally:
        if first.alive():
            stop(first)
    assert not (checkout / "var" / "run" / "env").exists()

    # No instance any more, and nothing else named: one line, no guessing at a database.
    refused = operator(checkout, "set_policy", "WORKER_QUEUE_LIMIT=9")
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0
    assert "no `make run` is running in this checkout" in refused.stderr
    assert stored_queue_limits(database)[0] == 7

    again = make_run(checkout, database, port, "make-run-again")
    try:
        again.wait_for("Sluice is running", timeout_s=180)
        # The environment says 16, the stored row 7: start-up says which one applies.
        line = again.wait_for("WORKER_QUEUE_LIMIT=16 in the environment")
        assert "the stored policy says 7" in line
        assert demo_key(again) == key
        assert "reusing the demo API key" in again.output()
    finally:
        if again.alive():
            stop(again)
    with psycopg.connect(admin_url(database)) as conn:
        keys = conn.execute("SELECT count(*) FROM workspaces_apikey").fetchone()
    assert keys == (1,)


def test_a_credentials_file_written_before_a_restart_works_after_it(
    checkout: Path, database: str, tmp_path: Path
) -> None:
    """With the embedded Redis (no REDIS_URL) and per-worker Redis users: a worker's file
    written while one run was up names the Redis of the next run too."""
    port = free_port()
    env = {
        k: v
        for k, v in make_run_env(database, port).items()
        # The embedded Redis is this run's own: the default key prefix, and ACL users on.
        if k not in {"REDIS_URL", "SLUICE_WORKER_REDIS_ACL", "SLUICE_REDIS_PREFIX"}
    }
    creds = tmp_path / "laptop.json"
    first = Process([PYTHON, "-m", "scripts.dev"], env, "make-run", cwd=checkout)
    try:
        first.wait_for("Sluice is running", timeout_s=180)
        done = operator(
            checkout, "bootstrap", "--user", "op", "--worker", "laptop", "--json",
            "--credentials-out", str(creds),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        key = demo_key(first)
    finally:
        if first.alive():
            stop(first)
    redis_port = int((checkout / "var" / "redis" / "port").read_text())
    assert f"127.0.0.1:{redis_port}/" in json.loads(creds.read_text())["redis_url"]

    again = Process([PYTHON, "-m", "scripts.dev"], env, "make-run-again", cwd=checkout)
    worker: Process | None = None
    try:
        again.wait_for("Sluice is running", timeout_s=180)
        assert f"starting embedded Redis on 127.0.0.1:{redis_port}" in again.output()
        repo = tmp_path / "repo"
        repo.mkdir()
        (repo / "README.md").write_text("laptop\n")
        # A worker machine: the file, its workspace and the API's URL; no server settings.
        worker = Process(
            [PYTHON, "manage.py", "runworker", "--credentials", str(creds),
             "--workspace", f"repo={repo}", "--api", f"http://127.0.0.1:{port}",
             "--allow-unsandboxed-commands"],
            shell_env(PYTHONUNBUFFERED="1"),
            "laptop-worker",
            cwd=checkout,
        )  # fmt: skip
        worker.wait_for("ready", timeout_s=90)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/workspace-tools/execute",
            headers={"Authorization": f"Bearer {key}", "X-LibreChat-Code-Worker-ID": "laptop"},
            json={"protocolVersion": 1, "operation": "read_file", "workspaceId": "repo",
                  "path": "README.md"},
            timeout=60,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["content"] == "laptop"
    finally:
        if worker is not None:
            worker.stop(40)
        if again.alive():
            stop(again)


def test_a_stale_instance_file_is_not_followed(checkout: Path) -> None:
    """A run killed outright leaves var/run/env behind; its dead pid makes it void."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = checkout / "var" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "env").write_text(
        f"SLUICE_RUN_PID={dead.pid}\nDATABASE_URL=postgres://root@127.0.0.1:1/gone\n"
        "SLUICE_LOCAL_SECRET=1\n"
    )
    refused = operator(checkout, "set_policy", "WORKER_QUEUE_LIMIT=9")
    assert refused.returncode == 2
    assert "no `make run` is running in this checkout" in refused.stderr
    assert json.dumps(refused.stderr).count("\\n") == 1


def test_an_api_served_as_make_run_starts_every_process_before_it_is_used(
    live_env: dict[str, str], transactional_db: None
) -> None:
    """benchmarks/overload.py --serve-as-make-run measures each process (its CPU, memory and
    Redis connections): `start_api(processes=N)` returns once N processes serve the one
    port, and names those, not uvicorn's supervisor or multiprocessing's helpers."""
    server = start_api(live_env, drainer=False, processes=2)
    try:
        pids = server.pids()
        assert len(set(pids)) == 2 and server.process.proc.pid not in pids
        for pid in pids:
            assert b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        for _ in range(10):  # each a connection of its own, whichever process takes it
            assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        server.process.stop()
