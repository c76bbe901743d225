"""The web surface: admin and dashboard are for staff only, state changes need a CSRF token,
every answer carries the usual security headers, and nothing debug-like ever shows.

Principals (owner, member, outsider) are API identities, not Django users: no page shows one
tenant's data to that tenant. A Django user who is not staff gets nothing either.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from livesupport import ROOT
from secsupport import CANCEL, EXECUTE, body
from sluice_protocol import OPERATIONS

from admission.policy import policy_row

pytestmark = pytest.mark.e2e

PASSWORD = "correct horse battery staple"
DASHBOARD_URLS = ("/dashboard/", "/dashboard/live/", "/dashboard/live.json")
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
DEBUG_SIGNS = ("Traceback", "DEBUG = True", "urlpatterns", "URLconf", "settings.py", "/work/")


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)


def sign_in(http: httpx.Client, username: str) -> httpx.Response:
    page = http.get("/admin/login/")
    return http.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": PASSWORD,
            "csrfmiddlewaretoken": csrf_token(page.text),
            "next": "/admin/",
        },
    )


def bare_env() -> dict[str, str]:
    """The environment of a process started with no Sluice settings at all."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }


def test_a_signed_in_user_who_is_not_staff_sees_no_dashboard_and_no_admin(
    api: Any, account_factory: Any
) -> None:
    owner = account_factory()
    User.objects.create_user("member-user", password=PASSWORD)
    with api.client() as anonymous:
        for url in DASHBOARD_URLS:
            # Signed out: sent to the admin login, with no data on the way.
            answer = anonymous.get(url)
            assert answer.status_code == 302
            assert answer.headers["location"].startswith("/admin/login/")
            # An API key is not a way in.
            with_key = anonymous.get(url, headers=owner.auth)
            assert with_key.status_code == 302
            assert owner.worker_id not in with_key.text
    with api.client() as member:
        # The admin login refuses a user who is not staff ...
        refused = sign_in(member, "member-user")
        assert refused.status_code == 200
        assert "staff account" in refused.text
        assert "sessionid" not in member.cookies
    client = Client()
    client.force_login(User.objects.get(username="member-user"))
    # ... and even with a session of their own, every dashboard URL answers 403, empty of data.
    for url in DASHBOARD_URLS:
        answer = client.get(url)
        assert answer.status_code == 403, url
        assert owner.worker_id not in answer.content.decode()
    assert client.get("/admin/").status_code == 302


def test_admin_state_changes_need_the_csrf_token(api: Any) -> None:
    User.objects.create_superuser("operator", password=PASSWORD)
    row = policy_row()
    change = f"/admin/admission/admissionpolicy/{row.pk}/change/"
    # A harmless edit (one queue place less), put back at the end: API processes share the row.
    original, edited = row.worker_queue_limit, row.worker_queue_limit - 1
    form = {
        "job_timeout_ms": row.job_timeout_ms,
        "queue_ceiling_ms": row.queue_ceiling_ms,
        "worker_queue_limit": edited,
        "max_lease_slots": row.max_lease_slots,
        "flow_share_percent": row.flow_share_percent,
        "rate_limit": row.rate_limit,
        "rate_limit_enabled": "on",
        # One box per operation (the admin's weights widget).
        **{f"operation_weights_{op}": 1 for op in sorted(OPERATIONS)},
        "_save": "Save",
    }
    with api.client() as http:
        # Even the login form needs it.
        assert http.post("/admin/login/", data={"username": "operator"}).status_code == 403
        assert sign_in(http, "operator").status_code == 302
        page = http.get(change)
        assert page.status_code == 200
        forged = http.post(change, data=form)
        assert forged.status_code == 403
        assert "CSRF" in forged.text
        row.refresh_from_db()
        assert row.worker_queue_limit == original
        # The same form with the token is accepted: the refusal was the missing token.
        saved = http.post(change, data=form | {"csrfmiddlewaretoken": csrf_token(page.text)})
        assert saved.status_code == 302, re.findall(r"errorlist.{0,300}", saved.text)
        row.refresh_from_db()
        assert row.worker_queue_limit == edited
        page = http.get(change)
        token = csrf_token(page.text)
        restored = http.post(
            change, data=form | {"worker_queue_limit": original, "csrfmiddlewaretoken": token}
        )
        assert restored.status_code == 302
        # The dashboard changes nothing: it answers GET only.
        assert http.get("/dashboard/").status_code == 200
        assert http.post("/dashboard/").status_code in (403, 405)
        session = next(c for c in http.cookies.jar if c.name == "sessionid")
        assert session.has_nonstandard_attr("HttpOnly")


def test_every_kind_of_answer_carries_the_security_headers(api: Any, account_factory: Any) -> None:
    owner = account_factory()
    User.objects.create_superuser("operator", password=PASSWORD)
    worker_auth = {"Authorization": f"Bearer {owner.worker_token}"}
    with api.client() as http:
        assert sign_in(http, "operator").status_code == 302
        answers = {
            "admin page": http.get("/admin/"),
            "admin login": http.get("/admin/login/"),
            "dashboard": http.get("/dashboard/"),
            "dashboard json": http.get("/dashboard/live.json"),
            "execute 401": http.post(EXECUTE, json={}),
            "execute 400": http.post(EXECUTE, headers=owner.auth, json={}),
            "execute 409": http.post(
                EXECUTE, headers=owner.auth, json=body("read_file", path="README.md")
            ),
            "execute 405": http.get(EXECUTE, headers=owner.auth),
            "cancel 404": http.delete(CANCEL.format("x" * 16), headers=owner.auth),
            "worker 401": http.post("/v1/workers/heartbeat", json={}),
            "worker 400": http.post("/v1/workers/heartbeat", headers=worker_auth, json={}),
            "unknown API path": http.get("/v1/no-such-endpoint"),
            "unknown page": http.get("/no-such-page"),
            "healthz": http.get("/healthz"),
            "metrics": http.get("/metrics"),
        }
    for name, answer in answers.items():
        for header, value in SECURITY_HEADERS.items():
            assert answer.headers.get(header) == value, (name, header, answer.status_code)
        if name.startswith(("execute", "cancel")):
            assert answer.headers["cache-control"] == "no-store", name
            assert answer.headers["content-type"] == "application/json", name


def test_debug_is_off_unless_asked_for_and_unknown_urls_show_no_debug_page(api: Any) -> None:
    # A production-like environment: its own SECRET_KEY and database, nothing else.
    env = bare_env() | {
        "SECRET_KEY": "a-production-secret-for-this-test",
        "DATABASE_URL": settings.DATABASE_URL,
    }
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.stdout.strip() == "False", shown.stderr
    with api.client() as http:
        for url in ("/no-such-page", "/v1/no-such-endpoint", "/dashboard/no-such-view"):
            answer = http.get(url)
            assert answer.status_code == 404, url
            for sign in DEBUG_SIGNS:
                assert sign not in answer.text, (url, sign)
        # A forged Host header is refused plainly too (DisallowedHost, no debug page).
        forged = http.get("/no-such-page", headers={"Host": "attacker.example"})
        assert forged.status_code == 400
        for sign in DEBUG_SIGNS:
            assert sign not in forged.text


def test_a_production_process_without_secret_key_refuses_to_start() -> None:
    # Nothing but what any process needs: no SECRET_KEY, no DEBUG, and no opt-in of any kind.
    env = bare_env()
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    assert "SECRET_KEY" in started.stderr


def test_metrics_want_their_own_token_from_every_address_and_take_no_api_key(
    account_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = account_factory()
    monkeypatch.delenv("METRICS_TOKEN", raising=False)
    for client in (Client(REMOTE_ADDR="203.0.113.7"), Client()):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=owner.auth).status_code == 401
    monkeypatch.setenv("METRICS_TOKEN", "scrape-" + os.urandom(8).hex())
    local = Client()
    assert local.get("/metrics").status_code == 401
    assert local.get("/metrics", headers=owner.auth).status_code == 401
    allowed = local.get(
        "/metrics", headers={"Authorization": f"Bearer {os.environ['METRICS_TOKEN']}"}
    )
    assert allowed.status_code == 200


def test_the_workspace_api_refuses_a_host_that_is_not_allowed_like_every_other_path(
    api: Any, account_factory: Any
) -> None:
    owner = account_factory()
    forged = {"Host": "attacker.example"}
    with api.client() as http:
        assert http.get("/metrics", headers=forged).status_code == 400
        execute = http.post(
            EXECUTE, headers=owner.auth | forged, json=body("read_file", path="README.md")
        )
        cancel = http.delete(CANCEL.format("x" * 16), headers=owner.auth | forged)
    assert execute.status_code == 400, execute.text
    assert cancel.status_code == 400, cancel.text
