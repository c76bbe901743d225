"""A staff user cancels a waiting call and drains and resumes a worker from the live cards, in
a real headless Chromium against real API processes and a real worker (issue 38).

Screenshots land in artifacts/ (gitignored), and also in $SLUICE_SHOTS_DIR when it is set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dashsupport import Calls, command, landed_rows, queue_entries, read, request_id, wait_until
from django.contrib.auth.models import Permission
from livesupport import git_workspace, unique
from test_dashboard_browser import ARTIFACTS, PASSWORD, _sign_in, chromium, require_chromium

# The waiting calls outlast a slow sign-in and the command ahead of them on a loaded machine.
WAIT_MS = 120_000


def shoot(page: Any, name: str, **kw: Any) -> None:
    page.screenshot(path=str(ARTIFACTS / name), **kw)
    shots = os.environ.get("SLUICE_SHOTS_DIR")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(shots) / name), **kw)


def test_staff_cancel_a_waiting_call_then_drain_and_resume_the_worker_from_its_card(
    api, account_factory, worker_factory, tmp_path, django_user_model
):
    executable = require_chromium()
    staff = django_user_model.objects.create_user(unique("staff"), password=PASSWORD, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_operatoraction"))
    owner = account_factory()
    w = owner.worker_id
    worker_factory(
        owner, {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")}, slots=2
    )
    calls = Calls(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": w})
    try:
        long_a = calls.submit(
            command("a", "sleep 45", timeout_ms=60_000), rid=request_id("ops-long")
        )
        wait_until(lambda: [e["st"] for e in queue_entries(w)] == ["r"])
        doomed_rid = request_id("ops-doomed")
        doomed = calls.submit(read("a"), rid=doomed_rid, wait_ms=WAIT_MS)
        wait_until(lambda: len(queue_entries(w)) == 2)
        kept = calls.submit(read("a"), rid=request_id("ops-kept"), wait_ms=WAIT_MS)
        wait_until(lambda: len(queue_entries(w)) == 3)

        with chromium(executable) as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            _sign_in(page, api.url, staff.username)
            page.wait_for_url(f"{api.url}/dashboard/")
            card = page.locator(f'article[data-worker="{w}"]')
            rows = card.locator("tr.waiting-call")
            rows.nth(1).wait_for(timeout=10_000)
            assert rows.count() == 2
            # Who waits: tenant and user, the operation, the workspace, how long.
            first = rows.first.inner_text()
            assert owner.tenant in first and owner.user in first and "read_file" in first
            assert (
                card.locator(".slot.busy .slot-who").inner_text()
                == f"{owner.user} · {owner.tenant}"
            )
            shoot(page, "card-waiting.png", clip=_card_box(card))

            # Cancel the first waiting call: the card changes without a reload.
            rows.first.locator("button.cancel").click()
            page.wait_for_function(
                "w => document.querySelectorAll(`article[data-worker='${w}'] tr.waiting-call`).length === 1",
                arg=w,
                timeout=10_000,
            )
            assert "Cancelled" in page.inner_text("#action-status")
            answer = doomed.result(timeout=30)
            assert answer.status_code == 409 and answer.json()["code"] == "REQUEST_CANCELLED"

            # Drain: the badge shows, and a call on the free slot's other workspace waits.
            card.locator("button.drain").click()
            card.locator(".badge.draining").wait_for(timeout=10_000)
            held = calls.submit(read("b"), rid=request_id("ops-held"), wait_ms=WAIT_MS)
            # Waiting on b with a slot free; the command on a may be running or done by now.
            wait_until(lambda: [e["st"] for e in queue_entries(w)].count("w") == 2)
            page.wait_for_function(
                "w => document.querySelectorAll(`article[data-worker='${w}'] tr.waiting-call`).length === 2",
                arg=w,
                timeout=10_000,
            )
            # Two slots, at most one busy: the call on b waits only because of the drain.
            states = [e["st"] for e in queue_entries(w)]
            assert states.count("w") == 2 and states.count("r") <= 1
            shoot(page, "card-draining.png", clip=_card_box(card))

            # Resume: the call on b is granted at once, and the badge goes.
            card.locator("button.resume").click()
            card.locator(".badge.draining").wait_for(state="detached", timeout=10_000)
            assert held.result(timeout=30).status_code == 200

            assert long_a.result(timeout=60).status_code == 200
            assert kept.result(timeout=60).status_code == 200

            page.goto(f"{api.url}/admin/admission/operatoraction/")
            listed = page.locator("#result_list tbody tr")
            assert listed.count() == 3
            assert [listed.nth(i).locator("td.field-action").inner_text() for i in range(3)] == [
                "resume a worker",
                "drain a worker",
                "cancel a waiting call",
            ]
            assert staff.username in listed.first.inner_text()
            shoot(page, "audit-list.png")
        # (Out of the browser's block: Playwright's loop runs in this thread, and Django
        # refuses database calls there.)
        row = landed_rows([doomed_rid])[doomed_rid]
        assert (row.code, row.outcome, row.operator_cancelled) == (
            "REQUEST_CANCELLED",
            "cancelled",
            True,
        )
    finally:
        calls.close()


def _card_box(card: Any) -> dict[str, float]:
    box = card.bounding_box()
    assert box is not None
    return {"x": 0, "y": max(0, box["y"] - 140), "width": 1400, "height": box["height"] + 160}
