"""A real contention scenario, attributed from the completion rows alone.

One long command holds workspace a's key on slot 0; a burst on a waits behind it and times
out; a burst on b passes them on slot 1 with short waits. Real API, real worker, real rows.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

from dashsupport import Calls, command, landed_rows, queue_entries, read, request_id, wait_until
from django.core.management import call_command
from django.utils import timezone
from livesupport import git_workspace

from dashboard.attribution import blamed_workspaces, blockers, recent_timeouts
from dashboard.window import Window

A_WAIT_MS = 1_500


def test_every_timeout_of_a_burst_is_attributed_to_workspace_a_and_the_call_holding_its_slot(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(
        owner, {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")}, slots=2
    )
    calls = Calls(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    long_id = request_id("long-on-a")
    a_ids = [request_id(f"burst-a{i}") for i in range(4)]
    b_ids = [request_id(f"burst-b{i}") for i in range(4)]
    try:
        long = calls.submit(command("a", "sleep 4"), rid=long_id)
        wait_until(lambda: any(e["st"] == "r" for e in queue_entries(owner.worker_id)))
        a_burst = [calls.submit(read("a"), rid=rid, wait_ms=A_WAIT_MS) for rid in a_ids]
        b_burst = [calls.submit(read("b"), rid=rid, wait_ms=10_000) for rid in b_ids]
        for f in a_burst:
            r = f.result()
            assert (r.status_code, r.json()["code"]) == (503, "WORKSPACE_QUEUE_TIMEOUT"), r.text
        assert [f.result().status_code for f in b_burst] == [200] * 4
        assert long.result().status_code == 200
    finally:
        calls.close()

    rows = landed_rows([long_id, *a_ids, *b_ids])
    held = rows[long_id]
    assert (held.http_status, held.admission_outcome, held.slot_index) == (200, "admitted", 0)
    assert held.queue_wait_ms < 500 and held.exec_ms is not None and held.exec_ms >= 4_000
    assert held.deadline_budget_ms == 30_000 + 30_000 + 5_000
    for rid in a_ids:
        row = rows[rid]
        assert (row.http_status, row.code, row.admission_outcome) == (
            503,
            "WORKSPACE_QUEUE_TIMEOUT",
            "queue_timeout",
        )
        assert row.slot_index is None and row.exec_ms is None and row.fencing_ticket is not None
        # The row keeps the whole wait, so the wait can be laid against what held the slots.
        assert A_WAIT_MS <= row.queue_wait_ms < A_WAIT_MS + 1_000
        assert row.isolation_key_hash == held.isolation_key_hash
        assert (row.workspace_id, row.operation, row.worker_id) == (
            "a",
            "read_file",
            owner.worker_id,
        )
        assert row.deadline_budget_ms == A_WAIT_MS + 30_000
    for rid in b_ids:
        row = rows[rid]
        assert (row.http_status, row.admission_outcome, row.slot_index) == (200, "admitted", 1)
        assert row.queue_wait_ms < 1_500
        assert row.isolation_key_hash != held.isolation_key_hash

    # Attribution, from the rows alone.
    window = Window(
        since=held.created_at - timedelta(minutes=1),
        until=timezone.now() + timedelta(minutes=1),
        worker=owner.worker_id,
    )
    timeouts = recent_timeouts(window)
    assert {t.request_id for t in timeouts} == set(a_ids)
    for t in timeouts:
        assert t.workspace_id == "a"
        assert [(h.request_id, h.slot_index, h.same_key) for h in t.blamed] == [(long_id, 0, True)]
        # b's calls ran beside it on slot 1: they held a slot, but never a's key.
        assert all(
            h.slot_index == 1 and not h.same_key for h in t.holders if h.request_id != long_id
        )
    [blocker] = blockers(timeouts)
    assert (blocker.holder.request_id, blocker.holder.workspace_id, blocker.timeouts) == (
        long_id,
        "a",
        4,
    )
    assert blamed_workspaces(timeouts) == [
        {"worker_id": owner.worker_id, "workspace_id": "a", "timeouts": 4}
    ]

    out = StringIO()
    call_command(
        "contention_report", "--since", "10m", "--worker", owner.worker_id, "--json", stdout=out
    )
    report = json.loads(out.getvalue())
    assert report["timeouts_total"] == 4
    assert report["blamed_workspaces"] == [
        {"worker_id": owner.worker_id, "workspace_id": "a", "timeouts": 4}
    ]
    assert [
        (b["request_id"], b["slot_index"], b["timeouts"]) for b in report["blocking_calls"]
    ] == [(long_id, 0, 4)]
    assert report["top_workspaces_by_timeouts"][0]["workspace_id"] == "a"
