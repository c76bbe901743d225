"""`manage.py bootstrap --json` as an operator runs it (contract §1), against the live API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import ROOT, run_command, unique

from workspaces.models import ApiKey, Principal, Tenant, Worker

CONTRACT_KEYS = ["tenant", "user", "api_key", "worker_id", "worker_token"]


def manage(
    env: dict[str, str], *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def bootstrap(
    env: dict[str, str], tenant: str, user: str, worker: str | None, *extra: str
) -> dict[str, str]:
    # In this process (livesupport.run_command): `env` is the test session's own anyway.
    naming = ("--worker", worker) if worker is not None else ()
    done = run_command("bootstrap", "--tenant", tenant, "--user", user, *naming, "--json", *extra)
    assert done.returncode == 0, done.stderr
    # Exactly one line of output, and it is the JSON object.
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout
    return dict(json.loads(done.stdout))


def register(http: httpx.Client, worker_id: str, token: str) -> httpx.Response:
    return http.post(
        "/v1/workers/register",
        headers={"Authorization": f"Bearer {token}"},
        json={
            "workerId": worker_id,
            "workspaces": [
                {"workspaceId": "repo", "operations": ["read_file"], "linkedWorktreeLanes": False}
            ],
            "slots": 1,
        },
    )


@pytest.fixture
def names() -> dict[str, str]:
    return {"tenant": unique("acme"), "user": "owner", "worker": unique("w")}


def test_bootstrap_prints_exactly_the_contracts_keys(
    live_env: dict[str, str], transactional_db: None
) -> None:
    tenant, worker = unique("acme"), unique("w")
    out = bootstrap(live_env, tenant, "owner", worker)
    assert list(out) == CONTRACT_KEYS
    assert (out["tenant"], out["user"], out["worker_id"]) == (tenant, "owner", worker)
    assert out["api_key"] and out["worker_token"] and out["api_key"] != out["worker_token"]


def test_bootstrap_twice_reuses_the_tenant_user_and_worker_and_adds_a_key(
    live_env: dict[str, str], transactional_db: None, names: dict[str, str]
) -> None:
    first = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    before = Worker.objects.get(worker_id=names["worker"])
    second = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    assert Tenant.objects.filter(name=names["tenant"]).count() == 1
    assert Principal.objects.filter(tenant__name=names["tenant"], name=names["user"]).count() == 1
    assert Worker.objects.filter(worker_id=names["worker"]).count() == 1
    assert ApiKey.objects.filter(principal__tenant__name=names["tenant"]).count() == 2
    assert first["api_key"] != second["api_key"]
    # The worker keeps its token and its Redis password: nothing was asked to rotate.
    assert list(second) == ["tenant", "user", "api_key", "worker_id"]
    after = Worker.objects.get(worker_id=names["worker"])
    assert (after.token_hash, after.redis_password_hash) == (
        before.token_hash,
        before.redis_password_hash,
    )
    # The first run made the worker the tenant's default; the second left it so.
    assert Tenant.objects.get(name=names["tenant"]).default_worker == after


def test_a_users_key_needs_no_worker(
    live_env: dict[str, str], transactional_db: None, names: dict[str, str]
) -> None:
    bootstrap(live_env, names["tenant"], "owner", names["worker"])
    # Another tenant's user: before, the default worker name made this "belongs to another
    # tenant"; now no worker is named, made or changed.
    other = unique("acme")
    out = bootstrap(live_env, other, "bob", None)
    assert list(out) == ["tenant", "user", "api_key"]
    assert ApiKey.objects.filter(principal__tenant__name=other, principal__name="bob").count() == 1
    assert not Worker.objects.filter(tenant__name=other).exists()
    # And a second user of the first tenant, without naming its worker, changes nothing of it.
    before = Worker.objects.get(worker_id=names["worker"]).token_hash
    assert list(bootstrap(live_env, names["tenant"], "member", None)) == [
        "tenant",
        "user",
        "api_key",
    ]
    assert Worker.objects.get(worker_id=names["worker"]).token_hash == before


def test_credentials_out_refuses_a_missing_directory_and_a_kept_token(
    live_env: dict[str, str], transactional_db: None, names: dict[str, str], tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "worker.json"
    args = ("--tenant", names["tenant"], "--worker", names["worker"], "--json")
    refused = run_command("bootstrap", *args, "--credentials-out", str(missing))
    assert refused.returncode != 0
    assert "does not exist" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no").exists()
    assert not Tenant.objects.filter(name=names["tenant"]).exists()
    # A new worker's file is written; the same worker again has no new token to write.
    out = tmp_path / "worker.json"
    assert run_command("bootstrap", *args, "--credentials-out", str(out)).returncode == 0
    written = out.read_text()
    again = run_command("bootstrap", *args, "--credentials-out", str(out))
    assert again.returncode != 0
    assert "--rotate-worker-token" in again.stderr
    assert out.read_text() == written
    assert ApiKey.objects.filter(principal__tenant__name=names["tenant"]).count() == 1
    rotated = run_command(
        "bootstrap", *args, "--rotate-worker-token", "--credentials-out", str(out)
    )
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(out.read_text())["worker_token"] == json.loads(rotated.stdout)["worker_token"]


def test_earlier_api_keys_stay_valid_after_a_second_bootstrap(
    api: Any, live_env: dict[str, str], names: dict[str, str]
) -> None:
    first = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    second = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    body = {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "repo",
        "path": "README.md",
    }
    with api.client() as http:
        answers = [
            http.post(
                "/v1/workspace-tools/execute",
                headers={
                    "Authorization": f"Bearer {key}",
                    "X-LibreChat-Code-Worker-ID": names["worker"],
                },
                json=body,
            )
            for key in (first["api_key"], second["api_key"], "slk_00000000_not-a-key")
        ]
    # Both keys get past authentication (the worker offers no workspace yet: 409); a made-up one does not.
    assert [a.status_code for a in answers] == [409, 409, 401]


def test_only_rotate_worker_token_replaces_the_worker_token(
    api: Any, live_env: dict[str, str], names: dict[str, str], tmp_path: Path
) -> None:
    old = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    kept = bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    unnamed = bootstrap(live_env, names["tenant"], names["user"], None)
    assert "worker_token" not in kept and "worker_token" not in unnamed
    with api.client() as http:
        # Twice, with and without --worker: the first token still registers the worker.
        still = register(http, names["worker"], old["worker_token"])
        assert still.status_code == 200, still.text
        new = bootstrap(
            live_env, names["tenant"], names["user"], names["worker"], "--rotate-worker-token"
        )
        assert new["worker_token"] != old["worker_token"]
        refused = register(http, names["worker"], old["worker_token"])
        accepted = register(http, names["worker"], new["worker_token"])
        http.post(
            "/v1/workers/deregister",
            headers={"Authorization": f"Bearer {new['worker_token']}"},
            json={"workerId": names["worker"], "incarnationId": accepted.json()["incarnationId"]},
        )
    assert refused.status_code == 401
    assert refused.json()["code"] == "UNAUTHENTICATED"
    assert "worker token is not valid" in refused.json()["error"]
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert accepted.status_code == 200, accepted.text
    # And a real worker started with the old token refuses to run, with one line saying why.
    (tmp_path / "repo").mkdir()
    run = manage(
        live_env, "runworker", "--worker-id", names["worker"], "--token", old["worker_token"],
        "--workspace", f"repo={tmp_path / 'repo'}", "--api", api.url,
    )  # fmt: skip
    assert run.returncode != 0
    assert "401" in run.stderr and "rotated or revoked" in run.stderr
    assert "API key" not in run.stderr


def test_bootstrap_refuses_a_worker_id_that_belongs_to_another_tenant(
    live_env: dict[str, str], transactional_db: None, names: dict[str, str]
) -> None:
    bootstrap(live_env, names["tenant"], names["user"], names["worker"])
    other = unique("other")
    taken = run_command("bootstrap", "--tenant", other, "--worker", names["worker"], "--json")
    assert taken.returncode != 0
    assert "another tenant" in taken.stderr
    assert taken.stdout == ""
    # Nothing of the refused run stays behind: no half-made tenant, no stray key.
    assert not Tenant.objects.filter(name=other).exists()
    assert Worker.objects.get(worker_id=names["worker"]).tenant.name == names["tenant"]
