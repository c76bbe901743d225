"""History queries, attribution and the dashboard pages on hand-made completion rows (no processes)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from admission.models import CompletionLog
from dashboard import history
from dashboard.attribution import blockers, recent_timeouts
from dashboard.window import Window, parse_duration

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)


def row(at_s: float, **fields: Any) -> CompletionLog:
    values: dict[str, Any] = {
        "uid": uuid.uuid4().hex,
        "request_id": fields.pop("request_id", uuid.uuid4().hex),
        "created_at": T0 + timedelta(seconds=at_s),
        "tenant_hash": "t" * 32,
        "principal_hash": "p" * 32,
        "worker_id": "w1",
        "workspace_id": "a",
        "isolation_key_hash": "ka" + "0" * 30,
        "operation": "read_file",
        "http_status": 200,
        "outcome": "completed",
        "admission_outcome": "admitted",
        "fencing_ticket": 1,
        "slot_index": 0,
        "queue_wait_ms": 0,
        "exec_ms": 10,
        "duration_ms": 10,
    }
    values.update(fields)
    return CompletionLog(**values)


def timeout(at_s: float, wait_ms: int, **fields: Any) -> CompletionLog:
    return row(
        at_s,
        http_status=503,
        code="WORKSPACE_QUEUE_TIMEOUT",
        admission_outcome="queue_timeout",
        slot_index=None,
        exec_ms=None,
        queue_wait_ms=wait_ms,
        duration_ms=wait_ms,
        **fields,
    )


@pytest.fixture
def scenario(db: None) -> dict[str, CompletionLog]:
    """A long command on workspace a (slot 0) while a's burst times out and b's burst runs on slot 1."""
    long = row(0, request_id="long-command-on-a-0001", operation="execute_command", exec_ms=8_000)
    b_calls = [
        row(
            1 + i * 0.1,
            workspace_id="b",
            isolation_key_hash="kb" + "0" * 30,
            slot_index=1,
            queue_wait_ms=30 * i,
            exec_ms=40,
        )
        for i in range(4)
    ]
    a_timeouts = [timeout(1 + i * 0.1, 1_000, request_id=f"a-burst-call-{i:04d}") for i in range(3)]
    other_worker = row(2, worker_id="w2", exec_ms=5_000)
    rows = [long, *b_calls, *a_timeouts, other_worker]
    CompletionLog.objects.bulk_create(rows)
    return {"long": long}


def window(**kw: Any) -> Window:
    return Window(since=T0 - timedelta(minutes=5), until=T0 + timedelta(minutes=5), **kw)


def test_every_timeout_is_blamed_on_the_call_holding_its_own_key(scenario):
    timeouts = recent_timeouts(window())
    assert len(timeouts) == 3
    for t in timeouts:
        assert t.workspace_id == "a"
        assert [h.request_id for h in t.blamed] == ["long-command-on-a-0001"]
        assert t.blamed[0].slot_index == 0 and t.blamed[0].same_key
        # b's calls on slot 1 held a slot meanwhile too, but never a's key.
        assert {h.slot_index for h in t.holders} == {0, 1}
        assert "long-command-on-a-0001" in t.verdict
    [top] = blockers(timeouts)
    assert (top.holder.request_id, top.timeouts) == ("long-command-on-a-0001", 3)


def test_a_holder_on_another_worker_is_never_blamed(scenario):
    for t in recent_timeouts(window()):
        assert all(h.workspace_id in {"a", "b"} for h in t.holders)
    assert recent_timeouts(window(worker="w2")) == []


def test_top_contended_ranks_workspaces_and_keys_by_wait_and_timeouts(scenario):
    by_wait, by_timeouts = history.top_contended(window(), by_key=False)
    assert [(c.workspace_id, c.total_wait_ms, c.timeouts) for c in by_wait] == [
        ("a", 3_000, 3),
        ("b", 180, 0),
    ]
    assert [c.workspace_id for c in by_timeouts] == ["a"]
    keys, _ = history.top_contended(window(), by_key=True)
    assert keys[0].key_hash.startswith("ka") and keys[0].workspace_id == "a"


def test_wait_percentiles_and_outcomes_per_minute(scenario):
    [point] = history.wait_percentiles(window(worker="w1"))
    assert point.t == T0 and point.calls == 8
    assert point.p50_ms == pytest.approx(75) and point.p99_ms == pytest.approx(1_000)
    buckets = history.outcomes(window())
    assert buckets == {T0: {"ok": 6, "queue_timeout": 3}}


def test_slot_usage_splits_a_long_call_across_minutes(db):
    # One call admitted at 12:00:30 running 90 s: 30 s in the first minute, 60 s in the second.
    CompletionLog.objects.bulk_create([row(30, exec_ms=90_000)])
    # A 2 h window is drawn in minute buckets (a 10 min one would get 10 s buckets).
    two_hours = Window(since=T0 - timedelta(hours=1), until=T0 + timedelta(hours=1))
    assert two_hours.step == timedelta(minutes=1)
    usage = dict(history.slot_usage(two_hours))
    assert usage[T0] == pytest.approx(0.5)
    assert usage[T0 + timedelta(minutes=1)] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("span", "step"),
    [
        (timedelta(minutes=15), timedelta(seconds=10)),
        (timedelta(hours=1), timedelta(seconds=30)),
        (timedelta(hours=6), timedelta(minutes=2)),
        (timedelta(hours=24), timedelta(minutes=10)),
        (timedelta(days=7), timedelta(hours=1)),
    ],
)
def test_the_bucket_follows_the_window(span: timedelta, step: timedelta) -> None:
    assert Window.last(span, now=T0).step == step


def test_parse_duration_accepts_units_and_refuses_nonsense():
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("7d") == timedelta(days=7)
    for bad in ("", "1", "1w", "-1h", "1.5h", "0h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_contention_report_prints_the_same_attribution(scenario, monkeypatch):
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: T0 + timedelta(minutes=5))
    out = StringIO()
    call_command("contention_report", "--since", "10m", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["timeouts_total"] == 3
    assert {t["workspace_id"] for t in report["timeouts"]} == {"a"}
    assert report["blamed_workspaces"] == [{"worker_id": "w1", "workspace_id": "a", "timeouts": 3}]
    assert report["blocking_calls"][0]["request_id"] == "long-command-on-a-0001"
    text = StringIO()
    call_command("contention_report", "--since", "10m", "--worker", "w1", stdout=text)
    assert "long-command-on-a-0001" in text.getvalue()
    assert "ka000000" in text.getvalue()
    # A table has a key column only where its rows have keys, and then every row fills it.
    lines = text.getvalue().splitlines()
    for title, has_key in (
        ("Workspaces by total wait:", False),
        ("Isolation keys by total wait:", True),
    ):
        header = lines[lines.index(title) + 1]
        assert ("  key  " in header) is has_key, header
        if has_key:
            start = header.index("key")
            rows = lines[lines.index(title) + 2 :]
            rows = rows[: rows.index("")]
            assert rows and all(row[start : start + 8].strip() for row in rows), rows


def test_contention_report_refuses_a_bad_window(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="duration"):
        call_command("contention_report", "--since", "yesterday")


@pytest.fixture
def staff(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("staff", password="pw-staff-123", is_staff=True)


@pytest.fixture
def member(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("member", password="pw-member-123")


def test_signed_out_visitors_are_sent_to_the_admin_login(db):
    response = Client().get("/dashboard/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/dashboard/")
    assert Client().get("/dashboard/live.json").status_code == 302


def test_a_member_who_is_not_staff_gets_403(member):
    client = Client()
    client.force_login(member)
    for path in ("/dashboard/", "/dashboard/live/", "/dashboard/live.json", "/dashboard/history/"):
        assert client.get(path).status_code == 403


def test_staff_sees_history_charts_and_the_timeouts_table(staff, scenario, monkeypatch):
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: T0 + timedelta(minutes=30))
    client = Client()
    client.force_login(staff)
    response = client.get("/dashboard/?range=1h")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("<svg") == 7  # six charts of the log, and queue depth
    assert "long-command-on-a" in html and "same key" in html
    # The three timeouts, counted and linked to exactly their rows in the completion log.
    log = "/admin/admission/completionlog/?since="
    assert html.count(log) > 5
    assert 'queue_timeout">3</a>' in html
    # The history half on its own, which the page fetches to refresh itself.
    fragment = client.get("/dashboard/history/?range=1h").content.decode()
    assert fragment.count("<svg") == 7 and "<html" not in fragment
    assert "queue wait (ms)" in html or "queue wait (s)" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing from a CDN


def test_the_admin_index_links_to_the_dashboard(staff):
    client = Client()
    client.force_login(staff)
    html = client.get("/admin/").content.decode()
    assert 'href="/dashboard/"' in html
