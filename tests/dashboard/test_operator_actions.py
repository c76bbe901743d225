"""The dashboard's staff actions end to end through Django (real Postgres, real Redis): cancel a
waiting call, drain and resume a worker; who waits on each card; and the refusals anyone who
is not staff gets, exactly as for the dashboard's pages."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from operatorkit import enter_call, forget_worker, registered_worker, sync_queue

from admission.models import OperatorAction
from workspaces.models import ApiKey, Principal, Tenant, Worker
from workspaces.secrets import new_secret

pytestmark = pytest.mark.django_db(transaction=True)

JSON = {"Accept": "application/json"}
CANCEL, DRAIN = "/dashboard/actions/cancel/", "/dashboard/actions/drain/"


@pytest.fixture
def worker() -> Iterator[Worker]:
    made = registered_worker()
    yield made
    forget_worker(made)


def key_of(tenant: Tenant, name: str) -> ApiKey:
    principal = Principal.objects.create(tenant=tenant, name=name)
    _, prefix, key_hash = new_secret("slk_")
    return ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash)


def signed_in(django_user_model: type[User], *, staff: bool, csrf: bool = False) -> Client:
    user = django_user_model.objects.create_user(
        f"{'staff' if staff else 'member'}-{django_user_model.objects.count()}", is_staff=staff
    )
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def entries(worker: Worker) -> dict[str, str]:
    _, found, _ = sync_queue().snapshot(worker.worker_id)
    return {e["id"]: e["st"] for e in found}


def actions(worker: Worker) -> dict[str, dict[str, str]]:
    return {
        "cancel": {"worker": worker.worker_id, "entry": "waiting"},
        "drain": {"worker": worker.worker_id},
        "resume": {"worker": worker.worker_id, "resume": "1"},
    }


def url_of(action: str) -> str:
    return CANCEL if action == "cancel" else DRAIN


def nothing_changed(worker: Worker) -> None:
    assert entries(worker) == {"running": "r", "waiting": "w"}
    assert not sync_queue().drained([worker.worker_id])
    assert not OperatorAction.objects.exists()


@pytest.fixture
def busy(worker: Worker) -> Worker:
    assert enter_call(worker, "running") == "granted"
    assert enter_call(worker, "waiting") == "waiting"
    return worker


@pytest.mark.parametrize("action", ["cancel", "drain", "resume"])
def test_each_action_is_refused_to_anyone_but_staff_and_without_the_csrf_token(
    action: str, busy: Worker, django_user_model: type[User]
) -> None:
    data: dict[str, Any] = actions(busy)[action]
    if action == "resume":
        sync_queue().drain(worker_id=busy.worker_id, note={"by": "earlier"})
    # Signed out: sent to the admin login, as for every dashboard page.
    anonymous = Client().post(url_of(action), data, headers=JSON)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    # Signed in without staff: the dashboard's own 403 page.
    member = signed_in(django_user_model, staff=False).post(url_of(action), data, headers=JSON)
    assert member.status_code == 403 and b"staff" in member.content
    # Staff, but the POST carries no CSRF token: Django's CSRF refusal.
    forged = signed_in(django_user_model, staff=True, csrf=True)
    forged.get("/dashboard/")  # has the CSRF cookie, as a page visit would
    refused = forged.post(url_of(action), data, headers=JSON)
    assert refused.status_code == 403 and b"CSRF" in refused.content
    # And a GET never acts.
    assert signed_in(django_user_model, staff=True).get(url_of(action)).status_code == 405
    if action == "resume":
        sync_queue().resume(worker_id=busy.worker_id, slot_ceiling=8)
        assert entries(busy) == {"running": "r", "waiting": "w"}
    nothing_changed(busy)


def csrf_client(django_user_model: type[User]) -> tuple[Client, str]:
    """Staff with CSRF enforced, and the token the page's forms carry."""
    client = signed_in(django_user_model, staff=True, csrf=True)
    page = client.get("/dashboard/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None, "the live cards' forms carry the CSRF token"
    return client, token.group(1)


def test_staff_cancel_a_waiting_call_but_never_a_running_one(
    busy: Worker, django_user_model: type[User]
) -> None:
    client, token = csrf_client(django_user_model)
    post = {"csrfmiddlewaretoken": token, "worker": busy.worker_id}
    running = client.post(CANCEL, {**post, "entry": "running"}, headers=JSON)
    assert running.status_code == 409 and running.json()["state"] == "running"
    cancelled = client.post(CANCEL, {**post, "entry": "waiting"}, headers=JSON)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert entries(busy) == {"running": "r"}
    again = client.post(CANCEL, {**post, "entry": "waiting"}, headers=JSON)
    assert again.status_code == 409 and again.json()["state"] == "gone"
    action = OperatorAction.objects.get()
    assert (action.action, action.via, action.target) == (
        "cancel",
        "dashboard",
        f"call waiting on {busy.worker_id}",
    )
    assert action.actor.startswith("staff-")
    # Without the page's script, the form posts and the page comes back saying what happened.
    plain = client.post(CANCEL, {**post, "entry": "nope"})
    assert plain.status_code == 302
    assert "no longer waiting" in client.get(plain["Location"]).content.decode()


def test_staff_drain_a_worker_the_card_and_metrics_say_so_and_resume_grants_in_order(
    busy: Worker, django_user_model: type[User]
) -> None:
    client, token = csrf_client(django_user_model)
    post = {"csrfmiddlewaretoken": token, "worker": busy.worker_id}
    assert client.post(DRAIN, post, headers=JSON).json()["draining"] is True
    card = client.get("/dashboard/live.json").json()["workers"][0]
    assert (card["worker_id"], card["draining"]) == (busy.worker_id, True)
    assert "is-draining" in client.get("/dashboard/live/").content.decode()
    metrics = client.get("/metrics").content.decode()
    assert f'sluice_worker_draining{{worker="{busy.worker_id}"}} 1.0' in metrics
    # Drained: the running call's end grants nothing (played by the worker's own script).
    _, found, _ = sync_queue().snapshot(busy.worker_id)
    ticket = next(int(e["seq"]) for e in found if e["id"] == "running")
    assert sync_queue().settle(
        worker_id=busy.worker_id,
        entry_id="running",
        incarnation="inc1",
        ticket=ticket,
        payload={"t": "result"},
    )
    assert entries(busy) == {"waiting": "w"}
    resumed = client.post(DRAIN, {**post, "resume": "1"}, headers=JSON)
    assert resumed.status_code == 200 and "1 waiting call(s) granted" in resumed.json()["message"]
    assert entries(busy) == {"waiting": "r"}
    assert client.get("/dashboard/live.json").json()["workers"][0]["draining"] is False
    assert [a.action for a in OperatorAction.objects.order_by("pk")] == ["drain", "resume"]


def test_each_waiting_call_shows_its_tenant_user_workspace_and_lane_and_the_filter_keeps_one_tenant(
    worker: Worker, django_user_model: type[User]
) -> None:
    mine = key_of(worker.tenant, "alice")
    other = key_of(Tenant.objects.create(name="globex"), "mallory")
    assert enter_call(worker, "running", workspace="repo", lane="one", key_id=mine.pk) == "granted"
    assert enter_call(worker, "w-alice", workspace="repo", lane="one", key_id=mine.pk) == "waiting"
    assert enter_call(worker, "w-mallory", workspace="repo", key_id=other.pk) == "waiting"
    client = signed_in(django_user_model, staff=True)
    card = client.get("/dashboard/live.json").json()["workers"][0]
    assert [
        (c["entry"], c["tenant"], c["user"], c["workspace_id"], c["lane"])
        for c in card["waiting_calls"]
    ] == [
        ("w-alice", worker.tenant.name, "alice", "repo", "one"),
        ("w-mallory", "globex", "mallory", "repo", ""),
    ]
    assert (card["slots"][0]["tenant"], card["slots"][0]["user"]) == (worker.tenant.name, "alice")
    html = client.get("/dashboard/live/").content.decode()
    assert f"?principal__id__exact={mine.principal_id}" in html  # alice's keys, to revoke
    filtered = client.get(f"/dashboard/live.json?tenant={other.principal.tenant_id}").json()
    assert [c["entry"] for c in filtered["workers"][0]["waiting_calls"]] == ["w-mallory"]
