"""The dashboard in a real headless Chromium: a staff user watches a slot go busy; a member is refused.

Needs Debian's chromium (`apt-get install -y chromium`) and the `playwright` package; the
browser is never downloaded. Screenshots land in artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashsupport import Calls, command, landed_rows, queue_entries, read, request_id, wait_until
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Permission
from django.test import Client
from livesupport import ROOT, git_workspace, unique

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "artifacts"
PASSWORD = "correct-horse-battery-staple"


def require_chromium() -> str:
    executable = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if executable is None:
        pytest.fail(
            "Chromium is missing: install Debian's package with `apt-get install -y chromium` "
            "(CI: in .ci/run)."
        )
    return executable


@contextlib.contextmanager
def chromium(executable: str) -> Iterator[Any]:
    # Playwright's sync API runs an event loop in this thread, where Django refuses database
    # calls: every database step of a test happens before the browser starts.
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("The playwright package is missing: pip install -r requirements-dev.txt.")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _sign_in(page: Any, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/dashboard/")
    assert "/admin/login/" in page.url  # signed out: sent to the admin login
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


def test_staff_sees_a_busy_slot_while_a_command_runs_and_a_member_is_refused(
    api, account_factory, worker_factory, tmp_path, django_user_model
):
    executable = require_chromium()
    staff = django_user_model.objects.create_user(unique("staff"), password=PASSWORD, is_staff=True)
    # The dashboard's numbers link to the completion log, which needs its view permission.
    staff.user_permissions.add(Permission.objects.get(codename="view_completionlog"))
    # At the API processes' own strength (Django's PBKDF2 hasher), not the test process's
    # quick one: the member signs in below, and an API process that re-hashed the password
    # would end the session made here.
    member = django_user_model.objects.create_user(unique("member"))
    member.password = make_password(PASSWORD, hasher="pbkdf2_sha256")
    member.save(update_fields=["password"])
    member_session = Client()
    member_session.force_login(member)
    owner = account_factory()
    w = owner.worker_id
    workspaces = {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")}
    worker_factory(owner, workspaces, slots=3)
    calls = Calls(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": w})
    try:
        # Some history first: a burst on a times out behind a command on a; b's calls pass.
        holder = request_id("history-holder")
        first = calls.submit(command("a", "sleep 2"), rid=holder)
        wait_until(lambda: len(queue_entries(w)) == 1)
        burst = [
            calls.submit(read("a"), rid=request_id(f"history-a{i}"), wait_ms=700) for i in range(3)
        ]
        burst += [calls.submit(read("b"), rid=request_id(f"history-b{i}")) for i in range(4)]
        assert sorted(f.result().status_code for f in burst) == [200] * 4 + [503] * 3
        assert first.result().status_code == 200
        landed_rows([holder])

        with chromium(executable) as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _sign_in(page, api.url, staff.username)
            page.wait_for_url(f"{api.url}/dashboard/")
            card = page.locator(f'article[data-worker="{w}"]')
            assert card.locator(".slot.free").count() == 3
            assert card.locator(".badge.online").count() == 1

            # A command runs on a with two reads queued behind it, another on b: the open page
            # shows them on its own, without a reload.
            long_a = calls.submit(command("a", "sleep 8"), rid=request_id("live-long-a"))
            long_b = calls.submit(command("b", "sleep 8"), rid=request_id("live-long-b"))
            wait_until(lambda: sum(e["st"] == "r" for e in queue_entries(w)) == 2)
            waiting = [calls.submit(read("a"), rid=request_id(f"live-wait{i}")) for i in range(2)]
            wait_until(lambda: len(queue_entries(w)) == 4)
            page.wait_for_function(
                "w => document.querySelectorAll(`article[data-worker='${w}'] .slot.busy`).length === 2"
                " && document.querySelector(`article[data-worker='${w}'] .waiting`) !== null",
                arg=w,
                timeout=10_000,
            )
            busy = card.locator(".slot.busy")
            shown = {
                (
                    busy.nth(i).locator(".slot-ws").inner_text(),
                    busy.nth(i).locator(".slot-op").inner_text(),
                )
                for i in range(2)
            }
            assert shown == {("a", "execute_command"), ("b", "execute_command")}
            assert all(len(busy.nth(i).locator(".slot-key").inner_text()) == 8 for i in range(2))
            assert card.locator(".stats dd").nth(1).inner_text() == "2"  # waiting
            assert "2 waiting on" in card.locator(".waiting").inner_text()
            assert card.locator(".fill-label").inner_text().replace("\n", " ").endswith("4 / 32")
            page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"))

            # History, drawn on the server: seven charts, and each timeout blamed on the holder.
            page.goto(f"{api.url}/dashboard/?range=15m&worker={w}")
            assert page.locator("svg.chart").count() == 7
            # Queue depth: the drainer process samples every 5 s, and the two reads above waited
            # behind the long command for ~7 s, so a sample saw (at least) both. Reload until
            # that sample is in: an earlier one, taken while only one of them waited, may be in
            # first (on a loaded machine the samples drift).
            deadline = time.monotonic() + 30
            while True:
                peak = re.search(r"Peak: (\d+) waiting", page.inner_text("#chart-queue-depth"))
                if peak and int(peak.group(1)) >= 2:
                    break
                assert time.monotonic() < deadline, (
                    f"no queue-depth sample with both waiting calls: {peak and peak.group(0)}"
                )
                page.wait_for_timeout(1000)
                page.reload()
            events = page.locator("#worker-events tbody tr")
            assert "registered" in events.last.inner_text() and w in events.last.inner_text()
            # Throughput, execution time and queue depth plot lines, not empty frames.
            for chart in (
                "#chart-throughput",
                "#chart-exec",
                "#chart-error-rate",
                "#chart-queue-depth",
            ):
                assert (
                    page.locator(f"{chart} svg.chart polyline, {chart} svg.chart circle").count()
                    >= 1
                )
                assert page.locator(f"{chart} svg.chart .empty").count() == 0
            by_code = page.locator("#failures-by-code tbody tr")
            assert by_code.count() == 1
            assert "503 WORKSPACE_QUEUE_TIMEOUT" in by_code.first.inner_text()
            assert by_code.first.locator("a").inner_text() == "3"
            callers = page.locator("#callers tbody tr")
            assert callers.count() == 1 and owner.tenant in callers.first.inner_text()
            timeouts = page.locator("table.timeouts tbody tr")
            assert timeouts.count() == 3
            # Compact rows: the holders fold away until asked for.
            assert not timeouts.first.locator("ul.holders").is_visible()
            timeouts.first.locator("summary").click()
            assert "same key" in timeouts.first.inner_text()
            assert holder[:12] in timeouts.first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-full.png"), full_page=True)

            # Every number links to its rows: the 3 timeouts, as the completion log lists them.
            by_code.first.locator("a").click()
            page.wait_for_url("**/admin/admission/completionlog/**")
            assert page.locator("#result_list tbody tr").count() == 3
            assert page.locator("#result_list tbody").inner_text().count("timed out waiting") == 3

            # A member who is not staff cannot sign in through the admin login ...
            refused = browser.new_page()
            _sign_in(refused, api.url, member.username)
            assert "/admin/login/" in refused.url
            assert "staff account" in refused.inner_text("body")
            # ... and with a session of their own the dashboard answers 403.
            cookie = member_session.cookies["sessionid"].value
            refused.context.add_cookies([{"name": "sessionid", "value": cookie, "url": api.url}])
            response = refused.goto(f"{api.url}/dashboard/")
            assert response is not None and response.status == 403
            assert "Staff only" in refused.inner_text("h1")
            refused.screenshot(path=str(ARTIFACTS / "dashboard-refused.png"))
            assert refused.goto(f"{api.url}/dashboard/live.json").status == 403

        assert long_a.result().status_code == 200 and long_b.result().status_code == 200
        assert [f.result().status_code for f in waiting] == [200, 200]
    finally:
        calls.close()
