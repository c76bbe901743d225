"""`GET /metrics`: Prometheus text that matches the live queues from every API process."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
from dashsupport import Calls, command, queue_entries, read, request_id, wait_until
from django.test import Client
from livesupport import METRICS_AUTH, git_workspace
from prometheus_client.parser import text_string_to_metric_families

ALLOWED_LABELS = {"worker", "reason", "code", "le"}


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """{sample name: {sorted labels: value}} of one scrape."""
    response = httpx.get(f"{url}/metrics", headers=METRICS_AUTH, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, sample
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sample's value; NaN (which no assertion accepts) when the series is missing."""
    return float(samples.get(name, {}).get(tuple(sorted(labels.items())), math.nan))


def test_gauges_match_the_live_queue_on_every_api_process(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    w = owner.worker_id
    calls = Calls(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": w})
    try:
        running = calls.submit(command("a", "sleep 3"), rid=request_id("metrics-long"))
        wait_until(lambda: len(queue_entries(w)) == 1)
        waiting = [calls.submit(read("a"), rid=request_id(f"metrics-wait{i}")) for i in range(2)]
        wait_until(lambda: len(queue_entries(w)) == 3)
        for server in api_servers:
            samples = scrape(server.url)
            assert value(samples, "sluice_queue_running", worker=w) == 1
            assert value(samples, "sluice_queue_waiting", worker=w) == 2
            assert value(samples, "sluice_slot_capacity", worker=w) == 2
            assert value(samples, "sluice_worker_online", worker=w) == 1
            assert value(samples, "sluice_queue_limit", worker=w) == 32
            assert 0 < value(samples, "sluice_queue_oldest_wait_seconds", worker=w) < 3
        timed_out = calls.send(read("a"), rid=request_id("metrics-timeout"), wait_ms=300)
        assert timed_out.status_code == 503
        assert running.result().status_code == 200
        assert [f.result().status_code for f in waiting] == [200, 200]
    finally:
        calls.close()

    def settled() -> dict[str, Any] | None:
        samples = scrape(api_servers[1].url)
        return samples if value(samples, "sluice_admissions_total", worker=w) == 3 else None

    samples = wait_until(settled, timeout_s=10)
    assert value(samples, "sluice_queue_running", worker=w) == 0
    assert value(samples, "sluice_queue_waiting", worker=w) == 0
    assert value(samples, "sluice_rejections_total", worker=w, reason="queue_timeout") == 1
    assert value(samples, "sluice_requests_total", worker=w, code="OK") == 3
    assert value(samples, "sluice_requests_total", worker=w, code="WORKSPACE_QUEUE_TIMEOUT") == 1
    # Four calls entered the queue (the timeout too); three ran.
    assert value(samples, "sluice_queue_wait_seconds_count", worker=w) == 4
    assert value(samples, "sluice_execution_seconds_count", worker=w) == 3
    assert value(samples, "sluice_execution_seconds_bucket", worker=w, le="300.0") == 3
    # The long command ran ~3 s: it is above the 2.5 s bucket and inside the 5 s one.
    assert value(samples, "sluice_execution_seconds_bucket", worker=w, le="2.5") == 2
    assert value(samples, "sluice_execution_seconds_bucket", worker=w, le="5.0") == 3
    # The two waiters waited ~3 s behind it; the timeout gave up after 0.3 s.
    assert value(samples, "sluice_queue_wait_seconds_bucket", worker=w, le="0.5") == 2
    assert value(samples, "sluice_queue_wait_seconds_sum", worker=w) > 5


def test_an_unknown_worker_id_never_becomes_a_label(api, account_factory):
    owner = account_factory()
    claimed = request_id("no-such-worker")
    with api.client() as http:
        r = http.post(
            "/v1/workspace-tools/execute",
            json=read("a"),
            headers=owner.auth | {"X-LibreChat-Code-Worker-ID": claimed},
        )
        assert r.status_code == 404

    def counted() -> dict[str, Any] | None:
        samples = scrape(api.url)
        return (
            samples
            if value(samples, "sluice_rejections_total", worker="", reason="worker_not_found")
            else None
        )

    samples = wait_until(counted, timeout_s=10)
    assert all(
        dict(labels).get("worker") != claimed for series in samples.values() for labels in series
    )


def test_metrics_want_the_token_or_a_staff_session_and_loopback_is_no_excuse(
    db, monkeypatch: pytest.MonkeyPatch, django_user_model
):
    # The test client is 127.0.0.1: where a command on a worker sharing the API's host connects from.
    monkeypatch.delenv("METRICS_TOKEN", raising=False)
    refused = Client().get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"sluice_" not in refused.content
    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401

    monkeypatch.setenv("METRICS_TOKEN", "scrape-secret-0123456789")
    for client in (Client(), Client(REMOTE_ADDR="203.0.113.9")):
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = client.get("/metrics", headers={"Authorization": "Bearer scrape-secret-0123456789"})
        assert ok.status_code == 200
        assert b"sluice_queue_limit" in ok.content


@pytest.mark.parametrize("token", ["", "scrape-secret-0123456789"])
def test_a_staff_session_reads_the_metrics_and_a_plain_user_gets_403(
    db, monkeypatch: pytest.MonkeyPatch, django_user_model, token: str
):
    monkeypatch.setenv("METRICS_TOKEN", token)
    staff = django_user_model.objects.create_user("ops", password="x", is_staff=True)
    browser = Client()
    browser.force_login(staff)
    seen = browser.get("/metrics")
    assert seen.status_code == 200
    assert b"sluice_queue_limit" in seen.content

    plain = Client()
    plain.force_login(django_user_model.objects.create_user("someone", password="x"))
    assert plain.get("/metrics").status_code == 403
    staff.is_active = False
    staff.save()
    assert browser.get("/metrics").status_code == 401  # a deactivated account is signed out


def test_a_loopback_socket_without_the_token_is_refused(api):
    # The session's API processes have a token; a local process that does not hold it is
    # refused like anyone else.
    refused = httpx.get(f"{api.url}/metrics", timeout=10)
    assert refused.status_code == 401
    assert "sluice_" not in refused.text
    assert httpx.get(f"{api.url}/metrics", headers=METRICS_AUTH, timeout=10).status_code == 200
