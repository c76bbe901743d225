"""The per-worker Redis user, as the product issues it (contract §4.4): bootstrap creates it,
its credentials serve calls end to end and reach nothing else, rotation replaces its password,
deleting the worker deletes it, and a Redis that cannot do it is refused in one line.

Everything runs on a throwaway `redis-server` of this module's own: the machine's shared Redis
never gets an ACL user. The worker process here is given nothing but its credentials file:
no REDIS_URL, no SECRET_KEY, no DATABASE_URL.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from livesupport import PYTHON, ROOT, ApiServer, Process, git_workspace, start_api, unique
from secsupport import EXECUTE, ThrowawayRedis, body, worker_queue

from admission.credentials import acl_user_name
from admission.management.commands.bootstrap import bootstrap
from admission.queue import worker_keys
from admission.workers_admin import worker_token_rotate
from workspaces.models import Worker
from workspaces.runtime.config import WorkerConfigError
from workspaces.runtime.credfile import load_credentials, resolve_credentials, write_credentials

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(tmp_path_factory.mktemp("acl-redis"))
    yield server
    server.stop()


@pytest.fixture
def issuing(acl_redis: ThrowawayRedis, settings: Any, transactional_db: None) -> ThrowawayRedis:
    """This process issues workers' credentials on the throwaway Redis, ACLs on."""
    url = acl_redis.url()
    settings.REDIS_URL = settings.CELERY_BROKER_URL = settings.ADMISSION_REDIS_URL = url
    settings.SLUICE_WORKER_REDIS_ACL = True
    return acl_redis


def user_exists(server: ThrowawayRedis, worker_id: str) -> bool:
    return server.admin.execute_command("ACL", "GETUSER", acl_user_name(worker_id)) is not None


def as_worker(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)


def refused(action: Any) -> bool:
    try:
        action()
    except redis.exceptions.NoPermissionError:
        return True
    except redis.exceptions.ResponseError as exc:
        return any(s in str(exc) for s in ("NOPERM", "no permissions", "can't access"))
    return False


def new_account(worker: str | None = None) -> dict[str, Any]:
    return bootstrap(tenant=unique("tenant"), user="owner", worker_id=worker or unique("w"))


def confined_env(live_env: dict[str, str], home: Path) -> dict[str, str]:
    """A worker machine's environment: none of the server's settings or secrets."""
    dropped = {
        "REDIS_URL",
        "ADMISSION_REDIS_URL",
        "CELERY_BROKER_URL",
        "DATABASE_URL",
        "SECRET_KEY",
        "SLUICE_LOCAL_SECRET",
        "DEBUG",
        "SLUICE_WORKER_TOKEN",
    }
    env = {k: v for k, v in live_env.items() if k not in dropped}
    env["HOME"] = str(home)
    env.pop("XDG_CONFIG_HOME", None)
    return env


@pytest.fixture
def acl_api(issuing: ThrowawayRedis, live_env: dict[str, str]) -> Iterator[ApiServer]:
    url = issuing.url()
    server = start_api(
        live_env
        | {
            "REDIS_URL": url,
            "ADMISSION_REDIS_URL": url,
            "SLUICE_WORKER_REDIS_ACL": "on",
        }
    )
    yield server
    server.process.stop()


def test_a_worker_with_only_its_credentials_file_serves_calls_and_reaches_nothing_else(
    issuing: ThrowawayRedis, acl_api: ApiServer, live_env: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    owner_id = unique("w")
    # bootstrap --credentials-out writes the file runworker reads by default for this id.
    out = home / ".config" / "sluice" / f"worker-{owner_id}.json"
    out.parent.mkdir(mode=0o700, parents=True)
    printed = io.StringIO()
    call_command(
        "bootstrap",
        "--tenant",
        unique("tenant"),
        "--worker",
        owner_id,
        "--json",
        "--credentials-out",
        str(out),
        stdout=printed,
    )
    account = json.loads(printed.getvalue())
    assert out.stat().st_mode & 0o777 == 0o600
    saved = json.loads(out.read_text())
    assert saved == {k: account[k] for k in saved}
    assert set(saved) == {"worker_id", "worker_token", "redis_url", "admission_redis_url"}
    assert user_exists(issuing, owner_id)
    other_id = new_account(f"{owner_id}-2")["worker_id"]  # an id that extends the owner's
    repo = git_workspace(tmp_path / "repo")
    env = confined_env(live_env, home)
    worker = Process(
        [
            PYTHON,
            "manage.py",
            "runworker",
            "--worker-id",
            owner_id,
            "--workspace",
            f"repo={repo}",
            "--api",
            acl_api.url,
        ],
        env,
        f"worker:{owner_id}",
    )
    try:
        worker.wait_for("registered: incarnation", timeout_s=60)
        worker.wait_for("ready", timeout_s=60)
        headers = {
            "Authorization": f"Bearer {account['api_key']}",
            "X-LibreChat-Code-Worker-ID": owner_id,
        }
        with httpx.Client(base_url=acl_api.url, timeout=60) as http:
            read = http.post(EXECUTE, headers=headers, json=body("read_file", path="README.md"))
            assert read.status_code == 200, read.text
            ran = http.post(
                EXECUTE, headers=headers, json=body("execute_command", command="echo confined")
            )
            assert ran.status_code == 200, ran.text
            assert ran.json()["stdout"] == "confined\n", ran.text
            # The command runs sandboxed: the worker's credentials file is not there for it,
            # though the worker itself reads it (the host can, as the first assertion shows).
            assert account["worker_token"] in out.read_text()
            peek = http.post(
                EXECUTE, headers=headers, json=body("execute_command", command=f"cat {out}")
            )
            assert peek.status_code == 200, peek.text
            assert peek.json()["exitCode"] != 0
            assert account["worker_token"] not in peek.text
    finally:
        worker.stop()

    from django.conf import settings

    p = settings.REDIS_KEY_PREFIX
    theirs = worker_keys(p, other_id)
    their_queue = f"{p}celery:{worker_queue(other_id)}"
    issuing.admin.hset(theirs.reg, "inc", "x")
    with as_worker(account["redis_url"]) as own:
        assert own.ping()
        assert refused(lambda: own.execute_command("MONITOR"))
        assert refused(lambda: own.keys("*"))
        assert refused(lambda: own.scan(0, match="*"))
        assert refused(lambda: own.get(theirs.reg))
        assert refused(lambda: own.hget(theirs.reg, "inc"))
        assert refused(lambda: own.delete(theirs.reg))
        assert refused(lambda: own.delete(their_queue))
        assert refused(lambda: own.lrange(their_queue, 0, -1))
        assert refused(lambda: own.flushall())
        assert refused(lambda: own.flushdb())
        assert refused(lambda: own.config_get("*"))
        assert refused(lambda: own.client_list())
        assert refused(lambda: own.execute_command("EVAL", "return 1", 0))
        # No loading a script of its own either: only the server's scripts run, by SHA.
        assert refused(lambda: own.script_load("return redis.call('KEYS', '*')"))
        assert refused(lambda: own.execute_command("ACL", "LIST"))
    assert issuing.admin.hget(theirs.reg, "inc") == "x"


def test_rotating_the_token_replaces_the_redis_password_and_deleting_the_worker_its_user(
    issuing: ThrowawayRedis,
) -> None:
    first = new_account()
    worker_id = first["worker_id"]
    with as_worker(first["redis_url"]) as client:
        assert client.ping()
    again = bootstrap(
        tenant=first["tenant"], user="owner", worker_id=worker_id, rotate_worker_token=True
    )
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_worker(first["redis_url"]).ping()
    with as_worker(again["redis_url"]) as client:
        assert client.ping()
    # The admin's rotation does the same.
    _, rotated = worker_token_rotate(worker=Worker.objects.get(worker_id=worker_id))
    assert rotated is not None
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_worker(again["redis_url"]).ping()
    live = as_worker(rotated.redis_url)
    assert live.ping()
    Worker.objects.get(worker_id=worker_id).delete()
    assert not user_exists(issuing, worker_id)
    # Deleting the user also drops the connection that was open as it.
    with pytest.raises(redis.exceptions.RedisError):
        live.ping()
    live.close()
    with pytest.raises(redis.exceptions.AuthenticationError):
        as_worker(rotated.redis_url).ping()


def test_a_redis_that_refuses_acl_setuser_refuses_bootstrap_in_one_line_and_saves_nothing(
    issuing: ThrowawayRedis, settings: Any
) -> None:
    # The API's own user may do everything except manage ACLs.
    issuing.set_user("no-acl-api", ["reset", "on", ">api-pw", "~*", "&*", "+@all", "-acl"])
    url = issuing.url("no-acl-api", "api-pw")
    settings.REDIS_URL = settings.CELERY_BROKER_URL = settings.ADMISSION_REDIS_URL = url
    worker_id = unique("w")
    with pytest.raises(CommandError) as refusal:
        call_command("bootstrap", "--tenant", unique("tenant"), "--worker", worker_id, "--json")
    message = str(refusal.value)
    assert "\n" not in message
    assert "ACL SETUSER" in message and "SLUICE_WORKER_REDIS_ACL=off" in message
    assert not Worker.objects.filter(worker_id=worker_id).exists()
    # The explicit opt-out: the worker gets no user and no URL of its own.
    settings.SLUICE_WORKER_REDIS_ACL = False
    result = new_account(worker_id)
    assert "redis_url" not in result
    assert not user_exists(issuing, worker_id)


def plain_shell_env(**extra: str) -> dict[str, str]:
    """A shell that set none of Sluice's variables (and is not a pytest session)."""
    keep = {"PATH", "HOME", "LANG", "TMPDIR"}
    return {k: v for k, v in os.environ.items() if k in keep} | extra


def test_bootstrap_without_secret_key_says_so_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "bootstrap", "--json"],
        cwd=ROOT,
        env=plain_shell_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "SECRET_KEY" in lines[0]


def test_runworker_refuses_a_credentials_file_others_can_read_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "worker-w.json"
    path.write_text(json.dumps({"worker_id": "w", "worker_token": "slw_x"}))
    path.chmod(0o640)
    with pytest.raises(WorkerConfigError, match="chmod 600"):
        load_credentials(path)
    done = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--credentials", str(path)],
        cwd=ROOT,
        env=plain_shell_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "readable by others" in lines[0], done.stderr
    path.chmod(0o600)
    assert resolve_credentials(worker_id=None, token=None, path=str(path)) == ("w", "slw_x")
    with pytest.raises(WorkerConfigError, match="is for worker w"):
        resolve_credentials(worker_id="v", token=None, path=str(path))


def test_the_credentials_file_is_written_0600_with_only_the_workers_part(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "worker-w.json"
    write_credentials(
        path,
        {"worker_id": "w", "worker_token": "slw_x", "api_key": "slk_secret", "tenant": "t"},
    )
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text()) == {"worker_id": "w", "worker_token": "slw_x"}
