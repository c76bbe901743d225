"""The audit trail: revoking keys and changing the policy (admin or
set_policy) each leave a row saying who and when, listed read-only in the admin."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from livesupport import run_command

from admission.models import OperatorAction
from admission.policy import policy_row
from workspaces.models import ApiKey, Principal, Tenant
from workspaces.secrets import new_secret

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin_client(django_user_model: type[User]) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root-ops", password="x"))
    return client


def trail() -> list[tuple[str, str, str, str]]:
    return [(a.actor, a.via, a.action, a.target) for a in OperatorAction.objects.order_by("pk")]


def test_revoking_keys_in_the_admin_is_recorded_once(
    admin_client: Client,
) -> None:
    principal = Principal.objects.create(tenant=Tenant.objects.create(name="acme"), name="alice")
    _, prefix, key_hash = new_secret("slk_")
    key = ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash)
    admin_client.post(
        "/admin/workspaces/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]}
    )
    # Revoking it again revokes nothing, and records nothing.
    admin_client.post(
        "/admin/workspaces/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]}
    )
    assert trail() == [("root-ops", "admin", "revoke", f"keys {prefix}")]
    assert OperatorAction.objects.get().result == "1 key(s) revoked"


def test_policy_changes_from_the_admin_and_the_command_line_are_recorded(
    admin_client: Client,
) -> None:
    assert run_command("set_policy", "WORKER_QUEUE_LIMIT=12").returncode == 0
    row = policy_row()
    page = admin_client.get(f"/admin/admission/admissionpolicy/{row.pk}/change/")
    form = page.context["adminform"].form
    data = {
        name: form.initial.get(name) for name in form.fields if form.initial.get(name) is not None
    }
    data["worker_queue_limit"] = 9
    data.update({f"operation_weights_{op}": w for op, w in row.operation_weights.items()})
    response = admin_client.post(f"/admin/admission/admissionpolicy/{row.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert [(via, action, target) for _, via, action, target in trail()] == [
        ("command", "policy", "global policy"),
        ("admin", "policy", "global policy"),
    ]
    first, second = OperatorAction.objects.order_by("pk")
    assert first.actor.startswith("shell:") and first.result == "WORKER_QUEUE_LIMIT=12"
    assert second.actor == "root-ops" and "worker_queue_limit" in second.result


def test_the_audit_trail_is_listed_read_only_in_the_admin(admin_client: Client) -> None:
    OperatorAction.objects.create(actor="ops", via="dashboard", action="drain", target="worker w1")
    listed = admin_client.get("/admin/admission/operatoraction/")
    assert listed.status_code == 200 and "worker w1" in listed.content.decode()
    assert admin_client.get("/admin/admission/operatoraction/add/").status_code == 403
