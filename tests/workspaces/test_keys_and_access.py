"""API keys and tenant scoping, told as a story about owner, member and outsider.

Everything goes through the live API (uvicorn) with real workers; the database is only read
to check what was stored, or written where an operator would (revoking a key).
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import httpx
from django.apps import apps
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone
from livesupport import git_workspace, wait_until

from workspaces.models import ApiKey, Worker

EXECUTE = "/v1/workspace-tools/execute"
READ_README = {
    "protocolVersion": 1,
    "operation": "read_file",
    "workspaceId": "repo",
    "path": "README.md",
}


def call(http: httpx.Client, api_key: str, worker_id: str, body: Any = None) -> httpx.Response:
    return http.post(
        EXECUTE,
        headers={"Authorization": f"Bearer {api_key}", "X-LibreChat-Code-Worker-ID": worker_id},
        json=READ_README if body is None else body,
    )


def same_headers(response: httpx.Response) -> dict[str, str]:
    return {
        k: v for k, v in response.headers.items() if k != "date" and not k.startswith("ratelimit")
    }


def key_row(raw: str) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(key_hash=hashlib.sha256(raw.encode()).hexdigest())


def rows_containing(text: str) -> list[str]:
    """Every table of Sluice's apps whose rows, as text, contain `text` anywhere."""
    found = []
    with connection.cursor() as cursor:
        for app in ("workspaces", "admission"):
            for model in apps.get_app_config(app).get_models():
                table = model._meta.db_table
                cursor.execute(
                    f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', [f"%{text}%"]
                )
                if cursor.fetchone()[0]:
                    found.append(table)
    return found


def test_raw_api_key_and_worker_token_are_stored_nowhere_only_their_hashes(
    account_factory: Any,
) -> None:
    owner = account_factory()
    key = ApiKey.objects.get(principal__name="owner", principal__tenant__name=owner.tenant)
    assert key_row(owner.api_key).get() == key
    assert owner.api_key.startswith(key.prefix) and len(key.prefix) < len(owner.api_key) // 2
    worker = Worker.objects.get(worker_id=owner.worker_id)
    assert worker.token_hash == hashlib.sha256(owner.worker_token.encode()).hexdigest()
    # The secret part (after the visible prefix) appears in no column of any table.
    assert rows_containing(owner.api_key.removeprefix(key.prefix)) == []
    assert rows_containing(owner.worker_token.split("_", 2)[2]) == []


def test_revoked_key_gets_401_within_a_second_while_the_principals_other_key_still_works(
    api: Any, account_factory: Any
) -> None:
    # Each API process remembers who a key is for at most a second (admission/callers.py).
    owner = account_factory()
    # A second bootstrap for the same user adds a key; the first one stays valid.
    second = account_factory(tenant=owner.tenant, user="owner", worker=owner.worker_id)
    with api.client() as http:
        # The worker never registered a workspace, so an authenticated call ends at 409.
        assert call(http, owner.api_key, owner.worker_id).json()["code"] == "WORKER_MISMATCH"
        key_row(owner.api_key).update(revoked_at=timezone.now())
        revoked = wait_until(
            lambda: (r := call(http, owner.api_key, owner.worker_id)).status_code == 401 and r,
            timeout_s=3,
            interval_s=0.2,
        )
        still_valid = call(http, second.api_key, owner.worker_id)
    assert revoked.status_code == 401
    assert revoked.json() == {"error": revoked.json()["error"], "code": "UNAUTHENTICATED"}
    assert still_valid.json()["code"] == "WORKER_MISMATCH"


def test_a_call_records_when_the_key_was_last_used(api: Any, account_factory: Any) -> None:
    owner = account_factory()
    key = ApiKey.objects.get(principal__tenant__name=owner.tenant)
    assert key.last_used_at is None
    before = timezone.now()
    with api.client() as http:
        call(http, owner.api_key, owner.worker_id)
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert before - timedelta(seconds=1) <= key.last_used_at <= timezone.now()


def test_owner_and_member_both_read_through_their_tenants_worker(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Any
) -> None:
    owner = account_factory(user="owner")
    # The member joins the owner's tenant; bootstrapping rotates the worker's token, so the
    # worker starts with the member's (latest) one.
    member = account_factory(tenant=owner.tenant, user="member", worker=owner.worker_id)
    worker_factory(
        member, {"repo": git_workspace(tmp_path / "repo", files={"README.md": "shared\n"})}
    )
    with api.client() as http:
        as_owner = call(http, owner.api_key, owner.worker_id)
        as_member = call(http, member.api_key, owner.worker_id)
    assert as_owner.status_code == 200, as_owner.text
    assert as_member.status_code == 200, as_member.text
    assert as_owner.json()["content"] == as_member.json()["content"] == "shared"


def test_outsider_cannot_tell_the_tenants_worker_from_a_worker_that_does_not_exist(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Any
) -> None:
    owner = account_factory()
    outsider = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    with api.client() as http:
        assert call(http, owner.api_key, owner.worker_id).status_code == 200
        foreign = call(http, outsider.api_key, owner.worker_id)
        # The same request once the worker is gone: a worker that does not exist.
        Worker.objects.filter(worker_id=owner.worker_id).delete()
        missing = call(http, outsider.api_key, owner.worker_id)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["code"] == "WORKER_NOT_FOUND"
    assert foreign.content == missing.content
    # Same headers too, but for the clock and the outsider's own rate-limit budget, which
    # the first call spent from.
    assert same_headers(foreign) == same_headers(missing)


def test_outsider_reaches_only_its_own_worker_even_with_the_owners_workspace_id(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Any
) -> None:
    owner = account_factory()
    outsider = account_factory()
    worker_factory(
        owner, {"repo": git_workspace(tmp_path / "owner", files={"README.md": "owner's\n"})}
    )
    worker_factory(
        outsider,
        {"repo": git_workspace(tmp_path / "outsider", files={"README.md": "outsider's\n"})},
    )
    with api.client() as http:
        # Without a worker header the tenant's default worker runs the call.
        unnamed = http.post(
            EXECUTE, headers={"Authorization": f"Bearer {outsider.api_key}"}, json=READ_README
        )
        named = call(http, outsider.api_key, owner.worker_id)
    assert unnamed.status_code == 200, unnamed.text
    assert unnamed.json()["content"] == "outsider's"
    assert named.status_code == 404
