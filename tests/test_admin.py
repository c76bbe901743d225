"""The Django admin as an operator uses it: log in, edit the policy, release quarantines,
revoke and create keys, rotate worker tokens, find workers that are offline.

Driven through Django's test client (real requests through the admin's views and forms), and
for quarantine release also through the live API, to see the release take effect.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from livesupport import git_workspace, wait_until
from sluice_protocol import OPERATIONS, isolation_key

from admission.models import AdmissionPolicy, CompletionLog, Quarantine
from admission.policy import current_policy, policy_row
from workspaces.access import caller_for_api_key
from workspaces.models import ApiKey, Principal, Tenant, Worker
from workspaces.secrets import API_KEY_PREFIX, keyed_hash, new_secret

POLICY_URL = "/admin/admission/admissionpolicy/"


def principal_id_of(raw_key: str) -> int | None:
    caller = caller_for_api_key(raw_key)
    return None if caller is None else caller.principal_id


def policy_form(*, weights: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """The policy page's POST: one number box per operation weight (1 unless given)."""
    data: dict[str, Any] = {
        "job_timeout_ms": 300_000,
        "queue_ceiling_ms": 300_000,
        "worker_queue_limit": 32,
        "flow_share_percent": 50,
        "max_lease_slots": 8,
        "rate_limit": "120/30s",
        "rate_limit_enabled": "on",
        "_save": "Save",
    }
    for op in sorted(OPERATIONS):
        data[f"operation_weights_{op}"] = (weights or {}).get(op, 1)
    data.update(changes)
    return data


def action(client: Client, changelist: str, name: str, pks: list[int]) -> Any:
    return client.post(
        changelist,
        {"action": name, "_selected_action": [str(pk) for pk in pks], "index": "0"},
        follow=True,
    )


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def make_key(principal: Principal) -> tuple[str, ApiKey]:
    raw, prefix, key_hash = new_secret(API_KEY_PREFIX)
    return raw, ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash)


@pytest.fixture
def tenant(db: None) -> Tenant:
    return Tenant.objects.create(name="acme")


@pytest.fixture
def owner(tenant: Tenant) -> Principal:
    return Principal.objects.create(tenant=tenant, name="owner")


# ---------------------------------------------------------------------------------------
# Logging in


def test_staff_login_to_admin_works_through_the_login_form(client: Client, db: None) -> None:
    User.objects.create_user(
        "operator", password="correct horse battery", is_staff=True, is_superuser=True
    )
    login = client.post(
        "/admin/login/?next=/admin/",
        {"username": "operator", "password": "correct horse battery", "next": "/admin/"},
    )
    assert login.status_code == 302 and login["Location"] == "/admin/"
    index = client.get("/admin/")
    assert index.status_code == 200
    for section in (
        "Admission policy",
        "Quarantines",
        "Completion logs",
        "Workers",
        "API keys",
        "Tenants",
    ):
        assert section in index.content.decode()


def test_a_user_who_is_not_staff_cannot_log_in_to_admin(client: Client, db: None) -> None:
    User.objects.create_user("visitor", password="correct horse battery")
    login = client.post(
        "/admin/login/?next=/admin/", {"username": "visitor", "password": "correct horse battery"}
    )
    assert login.status_code == 200  # The form again, with an error.
    assert client.get("/admin/").status_code == 302


# ---------------------------------------------------------------------------------------
# The policy page


def test_the_policy_list_is_the_one_policy_page_created_from_the_environment(
    admin_client: Client,
) -> None:
    response = admin_client.get(POLICY_URL)
    assert response.status_code == 302
    assert response["Location"] == f"{POLICY_URL}1/change/"
    row = AdmissionPolicy.objects.get()
    assert row.worker_queue_limit == AdmissionPolicy.from_env().worker_queue_limit
    assert admin_client.get(f"{POLICY_URL}add/").status_code == 403
    assert admin_client.get(f"{POLICY_URL}1/delete/").status_code == 403


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("queue_ceiling_ms", 300_001),
        ("queue_ceiling_ms", 0),
        ("worker_queue_limit", 0),
        ("max_lease_slots", 65),
        ("job_timeout_ms", 999),
        ("rate_limit", "120/30"),
        ("rate_limit", "0/30s"),
        ("operation_weights_read_file", 0),
        ("operation_weights_execute_command", 1001),
        ("operation_weights_list_files", ""),
    ],
)
def test_the_policy_page_refuses_an_out_of_range_value(
    admin_client: Client, field: str, value: Any
) -> None:
    before = policy_row()
    response = admin_client.post(f"{POLICY_URL}1/change/", policy_form(**{field: value}))
    assert response.status_code == 200  # The form again, not a redirect after saving.
    named = "operation_weights" if field.startswith("operation_weights") else field
    assert named in response.context["adminform"].form.errors
    after = AdmissionPolicy.objects.get()
    assert (after.queue_ceiling_ms, after.worker_queue_limit, after.rate_limit) == (
        before.queue_ceiling_ms,
        before.worker_queue_limit,
        before.rate_limit,
    )


def test_the_policy_page_refuses_a_weight_the_rate_limit_could_never_pay(
    admin_client: Client,
) -> None:
    policy_row()
    response = admin_client.post(
        f"{POLICY_URL}1/change/",
        policy_form(rate_limit="10/30s", weights={"read_file": 10, "execute_command": 11}),
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["operation_weights"]
    assert "execute_command (11)" in errors[0] and "read_file" not in errors[0]
    assert AdmissionPolicy.objects.get().rate_limit == "120/30s"


def test_a_valid_policy_edit_is_stored_and_used_at_once(admin_client: Client) -> None:
    policy_row()
    current_policy()  # Warm this process's cache, which the save must not leave stale.
    response = admin_client.post(
        f"{POLICY_URL}1/change/",
        policy_form(worker_queue_limit=5, rate_limit="10/30s", weights={"execute_command": 10}),
    )
    assert response.status_code == 302
    policy = current_policy()
    assert (policy.worker_queue_limit, policy.rate.limit, policy.weight("execute_command")) == (
        5,
        10,
        10,
    )


# ---------------------------------------------------------------------------------------
# Quarantines


def quarantine(worker_id: str = "w1", workspace_id: str = "repo", **fields: Any) -> Quarantine:
    return Quarantine.objects.create(
        worker_id=worker_id,
        workspace_id=workspace_id,
        isolation_key_hash=fields.pop("isolation_key_hash", "k" * 32),
        operation="write_file",
        reason="the write may or may not have happened",
        **fields,
    )


def test_release_action_releases_only_unreleased_quarantines_and_names_the_operator(
    admin_client: Client, admin_user: User
) -> None:
    earlier = timezone.now() - timedelta(days=1)
    open_one = quarantine()
    released = quarantine(released_at=earlier, released_by="alice")
    response = action(
        admin_client,
        "/admin/admission/quarantine/",
        "release_quarantines",
        [open_one.pk, released.pk],
    )
    assert response.status_code == 200
    assert any("Released 1 quarantine" in m for m in messages_of(response))
    open_one.refresh_from_db()
    released.refresh_from_db()
    assert open_one.released_at is not None and open_one.released_by == admin_user.username
    assert (released.released_at, released.released_by) == (earlier, "alice")


def test_quarantine_filter_shows_released_and_unreleased_apart(admin_client: Client) -> None:
    quarantine(workspace_id="still-blocked")
    quarantine(workspace_id="let-go", released_at=timezone.now(), released_by="alice")
    unreleased = admin_client.get("/admin/admission/quarantine/?released=no").content.decode()
    released = admin_client.get("/admin/admission/quarantine/?released=yes").content.decode()
    assert "still-blocked" in unreleased and "let-go" not in unreleased
    assert "let-go" in released and "still-blocked" not in released


def test_quarantines_cannot_be_added_edited_or_deleted_from_admin(admin_client: Client) -> None:
    row = quarantine()
    assert admin_client.get("/admin/admission/quarantine/add/").status_code == 403
    assert (
        admin_client.post(
            f"/admin/admission/quarantine/{row.pk}/change/", {"reason": "x"}
        ).status_code
        == 403
    )
    assert admin_client.get(f"/admin/admission/quarantine/{row.pk}/delete/").status_code == 403
    row.refresh_from_db()
    assert row.reason == "the write may or may not have happened"


def test_a_released_quarantine_lets_calls_through_again(
    api: Any, account_factory: Any, worker_factory: Any, tmp_path: Any
) -> None:
    owner = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    body = {
        "protocolVersion": 1,
        "operation": "read_file",
        "workspaceId": "repo",
        "path": "README.md",
    }
    base, lane = isolation_key(body)
    blocked = quarantine(
        worker_id=owner.worker_id,
        isolation_key_hash=keyed_hash("isolation", f"{owner.worker_id}\x1f{base}\x1f{lane}"),
    )
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    operator = User.objects.create_superuser("operator", password="correct horse battery")
    browser = Client()
    browser.force_login(operator)
    with api.client() as http:
        before = http.post("/v1/workspace-tools/execute", headers=headers, json=body)
        action(browser, "/admin/admission/quarantine/", "release_quarantines", [blocked.pk])
        # A release reaches every API process within the caller cache's second.
        after = wait_until(
            lambda: (
                (
                    r := http.post("/v1/workspace-tools/execute", headers=headers, json=body)
                ).status_code
                == 200
                and r
            ),
            timeout_s=3,
            interval_s=0.2,
        )
    assert (before.status_code, before.json()["code"]) == (409, "WORKSPACE_QUARANTINED")
    assert after.status_code == 200, after.text


# ---------------------------------------------------------------------------------------
# Completion log


def completion(**fields: Any) -> CompletionLog:
    values: dict[str, Any] = {
        "uid": hashlib.md5(repr(fields).encode()).hexdigest(),
        "request_id": "req-0123456789abcdef",
        "tenant_hash": "t" * 32,
        "principal_hash": "p" * 32,
        "worker_id": "w1",
        "workspace_id": "repo",
        "operation": "read_file",
        "http_status": 200,
        "outcome": "completed",
        "admission_outcome": "admitted",
    }
    values.update(fields)
    return CompletionLog.objects.create(**values)


def test_the_completion_log_is_read_only_in_admin(admin_client: Client) -> None:
    row = completion()
    changelist = admin_client.get("/admin/admission/completionlog/")
    assert changelist.status_code == 200
    assert "req-0123456789abcdef" in changelist.content.decode()
    assert 'name="action"' not in changelist.content.decode()  # No actions, so no bulk delete.
    detail = admin_client.get(f"/admin/admission/completionlog/{row.pk}/change/")
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()
    assert admin_client.get("/admin/admission/completionlog/add/").status_code == 403
    assert (
        admin_client.post(
            f"/admin/admission/completionlog/{row.pk}/change/", {"http_status": 500}
        ).status_code
        == 403
    )
    assert admin_client.get(f"/admin/admission/completionlog/{row.pk}/delete/").status_code == 403
    row.refresh_from_db()
    assert row.http_status == 200


def test_completion_log_search_matches_whole_ids_and_filters_by_outcome(
    admin_client: Client,
) -> None:
    completion(request_id="req-aaaaaaaaaaaaaaaa")
    completion(request_id="req-bbbbbbbbbbbbbbbb", http_status=429, admission_outcome="queue_full")
    url = "/admin/admission/completionlog/"
    exact = admin_client.get(url, {"q": "req-aaaaaaaaaaaaaaaa"}).content.decode()
    partial = admin_client.get(url, {"q": "aaaaaaaa"}).content.decode()
    full = admin_client.get(url, {"admission_outcome": "queue_full"}).content.decode()
    assert "req-aaaaaaaaaaaaaaaa" in exact and "req-bbbbbbbbbbbbbbbb" not in exact
    assert "req-aaaaaaaaaaaaaaaa" not in partial
    assert "req-bbbbbbbbbbbbbbbb" in full and "req-aaaaaaaaaaaaaaaa" not in full
    # The filters offer every known value without asking the table for its distinct values.
    for value in sorted(OPERATIONS):
        assert f"operation={value}" in full


# ---------------------------------------------------------------------------------------
# API keys


def test_revoke_action_revokes_the_selected_keys_and_keeps_earlier_revocations(
    admin_client: Client, owner: Principal
) -> None:
    raw, key = make_key(owner)
    earlier = timezone.now() - timedelta(days=3)
    _, old = make_key(owner)
    ApiKey.objects.filter(pk=old.pk).update(revoked_at=earlier)
    untouched_raw, _ = make_key(owner)
    assert principal_id_of(raw) == owner.pk
    response = action(admin_client, "/admin/workspaces/apikey/", "revoke_keys", [key.pk, old.pk])
    assert any("Revoked 1 key" in m for m in messages_of(response))
    key.refresh_from_db()
    old.refresh_from_db()
    assert key.revoked_at is not None
    assert old.revoked_at == earlier
    assert principal_id_of(raw) is None
    assert principal_id_of(untouched_raw) == owner.pk


def test_api_key_pages_never_show_the_key_hash(admin_client: Client, owner: Principal) -> None:
    _, key = make_key(owner)
    for url in (
        "/admin/workspaces/apikey/",
        f"/admin/workspaces/apikey/{key.pk}/change/",
        f"/admin/workspaces/principal/{owner.pk}/change/",
    ):
        page = admin_client.get(url)
        assert page.status_code == 200
        assert key.prefix in page.content.decode()
        assert key.key_hash not in page.content.decode()


def test_api_keys_filter_by_tenant_and_revocation(admin_client: Client, owner: Principal) -> None:
    other = Principal.objects.create(tenant=Tenant.objects.create(name="globex"), name="outsider")
    _, mine = make_key(owner)
    _, theirs = make_key(other)
    ApiKey.objects.filter(pk=theirs.pk).update(revoked_at=timezone.now())
    by_tenant = admin_client.get(
        "/admin/workspaces/apikey/", {"principal__tenant__id__exact": owner.tenant_id}
    )
    revoked = admin_client.get("/admin/workspaces/apikey/", {"revoked": "yes"})
    assert [k.pk for k in by_tenant.context["cl"].result_list] == [mine.pk]
    assert [k.pk for k in revoked.context["cl"].result_list] == [theirs.pk]


def test_create_api_key_action_shows_a_working_key_exactly_once(
    admin_client: Client, owner: Principal
) -> None:
    response = action(admin_client, "/admin/workspaces/principal/", "create_api_key", [owner.pk])
    shown = re.findall(r"slk_[0-9a-f]{8}_[A-Za-z0-9_-]+", " ".join(messages_of(response)))
    assert len(shown) == 1
    assert principal_id_of(shown[0]) == owner.pk
    assert shown[0] not in admin_client.get("/admin/workspaces/principal/").content.decode()


def test_an_api_key_added_on_the_keys_page_works_is_shown_once_and_can_be_revoked(
    admin_client: Client, owner: Principal
) -> None:
    form = admin_client.get("/admin/workspaces/apikey/add/")
    assert form.status_code == 200
    assert 'name="principal"' in form.content.decode()
    response = admin_client.post(
        "/admin/workspaces/apikey/add/", {"principal": owner.pk, "label": "ci"}, follow=True
    )
    shown = re.findall(r"slk_[0-9a-f]{8}_[A-Za-z0-9_-]+", " ".join(messages_of(response)))
    assert len(shown) == 1
    assert principal_id_of(shown[0]) == owner.pk
    key = ApiKey.objects.get(principal=owner)
    assert key.label == "ci" and shown[0].startswith(key.prefix)
    assert key.key_hash == hashlib.sha256(shown[0].encode()).hexdigest()
    # Shown once: no page after the message has it.
    for url in ("/admin/workspaces/apikey/", f"/admin/workspaces/apikey/{key.pk}/change/"):
        assert shown[0] not in admin_client.get(url).content.decode()
    revoked = action(admin_client, "/admin/workspaces/apikey/", "revoke_keys", [key.pk])
    assert any("Revoked 1 key" in m for m in messages_of(revoked))
    assert principal_id_of(shown[0]) is None


# ---------------------------------------------------------------------------------------
# Workers


def worker(
    tenant: Tenant, worker_id: str, *, heartbeat_s_ago: float | None, registered: bool = True
) -> Worker:
    return Worker.objects.create(
        worker_id=worker_id,
        tenant=tenant,
        token_hash="0" * 64,
        incarnation_id="a" * 32 if registered else "",
        last_heartbeat_at=None
        if heartbeat_s_ago is None
        else timezone.now() - timedelta(seconds=heartbeat_s_ago),
    )


def test_worker_online_filter_uses_the_heartbeat_age(admin_client: Client, tenant: Tenant) -> None:
    worker(tenant, "fresh", heartbeat_s_ago=2)
    worker(tenant, "silent", heartbeat_s_ago=31)
    worker(tenant, "deregistered", heartbeat_s_ago=2, registered=False)
    worker(tenant, "never-seen", heartbeat_s_ago=None, registered=False)
    online = (
        admin_client.get("/admin/workspaces/worker/", {"online": "yes"}).context["cl"].result_list
    )
    offline = (
        admin_client.get("/admin/workspaces/worker/", {"online": "no"}).context["cl"].result_list
    )
    assert [w.worker_id for w in online] == ["fresh"]
    assert sorted(w.worker_id for w in offline) == ["deregistered", "never-seen", "silent"]


def test_rotate_token_shows_a_new_token_once_and_the_old_one_stops_matching(
    admin_client: Client, tenant: Tenant
) -> None:
    row = worker(tenant, "w1", heartbeat_s_ago=None)
    response = action(admin_client, "/admin/workspaces/worker/", "rotate_token", [row.pk])
    tokens = re.findall(r"slw_[0-9a-f]{8}_[A-Za-z0-9_-]+", " ".join(messages_of(response)))
    assert len(tokens) == 1
    row.refresh_from_db()
    assert row.token_hash == hashlib.sha256(tokens[0].encode()).hexdigest()


def test_a_tenants_default_worker_can_only_be_one_of_its_own(
    admin_client: Client, tenant: Tenant
) -> None:
    own = worker(tenant, "own-worker", heartbeat_s_ago=None)
    foreign = worker(Tenant.objects.create(name="globex"), "foreign-worker", heartbeat_s_ago=None)
    page = admin_client.get(f"/admin/workspaces/tenant/{tenant.pk}/change/").content.decode()
    assert "own-worker" in page and "foreign-worker" not in page
    inline = {
        "principals-TOTAL_FORMS": "0",
        "principals-INITIAL_FORMS": "0",
        "policy_override-TOTAL_FORMS": "0",
        "policy_override-INITIAL_FORMS": "0",
    }
    refused = admin_client.post(
        f"/admin/workspaces/tenant/{tenant.pk}/change/",
        {"name": "acme", "default_worker": foreign.pk, **inline},
    )
    assert refused.status_code == 200
    assert "default_worker" in refused.context["adminform"].form.errors
    accepted = admin_client.post(
        f"/admin/workspaces/tenant/{tenant.pk}/change/",
        {"name": "acme", "default_worker": own.pk, **inline},
    )
    assert accepted.status_code == 302
    tenant.refresh_from_db()
    assert tenant.default_worker == own


def test_a_worker_added_in_admin_gets_a_token_shown_once(
    admin_client: Client, tenant: Tenant
) -> None:
    response = admin_client.post(
        "/admin/workspaces/worker/add/",
        {"worker_id": "added-by-hand", "tenant": tenant.pk},
        follow=True,
    )
    tokens = re.findall(r"slw_[0-9a-f]{8}_[A-Za-z0-9_-]+", " ".join(messages_of(response)))
    assert len(tokens) == 1
    added = Worker.objects.get(worker_id="added-by-hand")
    assert added.token_hash == hashlib.sha256(tokens[0].encode()).hexdigest()


# ---------------------------------------------------------------------------------------
# Overrides, branding, and pages that read right


def test_a_tenant_override_saved_on_the_tenant_page_shows_on_its_workers_page(
    admin_client: Client, tenant: Tenant
) -> None:
    worker = Worker.objects.create(worker_id="w-acme", tenant=tenant, token_hash="x" * 64)
    prefix = "policy_override"
    response = admin_client.post(
        f"/admin/workspaces/tenant/{tenant.pk}/change/",
        {
            "name": tenant.name,
            "default_worker": "",
            "principals-TOTAL_FORMS": "0",
            "principals-INITIAL_FORMS": "0",
            f"{prefix}-TOTAL_FORMS": "1",
            f"{prefix}-INITIAL_FORMS": "0",
            f"{prefix}-0-worker_queue_limit": "4",
            f"{prefix}-0-rate_limit": "",
            f"{prefix}-0-rate_limit_enabled": "unknown",
            "_save": "Save",
        },
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert tenant.policy_override.worker_queue_limit == 4
    page = admin_client.get(f"/admin/workspaces/worker/{worker.pk}/change/").content.decode()
    effective = page[page.index('class="effective-policy"') :]
    assert re.search(r"Queue limit per worker</th><td>4</td><td>from tenant", effective)
    assert re.search(r"Rate limit per principal</th><td>120/30s</td><td>from global", effective)


def test_admin_is_branded_and_view_site_and_root_lead_to_the_dashboard(
    admin_client: Client, client: Client, db: None
) -> None:
    index = admin_client.get("/admin/").content.decode()
    assert "Sluice administration" in index and "Django administration" not in index
    assert 'href="/dashboard/"' in index
    root = admin_client.get("/")
    assert root.status_code == 302 and root["Location"] == "/dashboard/"
    anonymous = client.get("/")
    assert anonymous.status_code == 200
    assert anonymous.json()["execute"] == "/v1/workspace-tools/execute"


def test_the_policy_page_has_readable_labels_and_one_box_per_weight(
    admin_client: Client,
) -> None:
    policy_row()
    page = admin_client.get(f"{POLICY_URL}1/change/").content.decode()
    assert "Queue limit per worker" in page and "Environment: WORKER_QUEUE_LIMIT" in page
    for op in OPERATIONS:
        assert f'name="operation_weights_{op}"' in page
    assert "<textarea" not in page


def test_the_completion_log_says_refused_for_a_refusal_and_shows_seconds(
    admin_client: Client, db: None
) -> None:
    at = timezone.now().replace(microsecond=0)
    CompletionLog.objects.create(
        uid="u1",
        request_id="r-429",
        created_at=at,
        tenant_hash="t",
        principal_hash="p",
        worker_id="w1",
        operation="read_file",
        http_status=429,
        code="rate_limited",
        outcome="completed",
        admission_outcome="rate_limited",
    )
    page = admin_client.get("/admin/admission/completionlog/").content.decode()
    assert "refused: rate limited" in page
    assert at.strftime("%Y-%m-%d %H:%M:%S") in page
    row = CompletionLog.objects.get()
    detail = admin_client.get(f"/admin/admission/completionlog/{row.pk}/change/").content.decode()
    assert "refused: rate limited" in detail
    # The stored value is the contract's and stays as it was.
    assert CompletionLog.objects.get().outcome == "completed"


def test_an_active_key_reads_active_and_a_revoked_one_says_when(
    admin_client: Client, owner: Principal
) -> None:
    make_key(owner)
    _, revoked = make_key(owner)
    revoked.revoked_at = timezone.now()
    revoked.save()
    page = admin_client.get("/admin/workspaces/apikey/").content.decode()
    assert ">active<" in page
    assert f"revoked {revoked.revoked_at.strftime('%Y-%m-%d %H:%M:%S')}" in page
    assert "icon-no.svg" not in page
