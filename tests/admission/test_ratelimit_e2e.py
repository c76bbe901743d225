"""The workspace rate limit end to end (CONTRACT §3): real API processes, workers and Redis.

Policies are changed in the test database; the save bumps the policy version, so every API
process has the change from its next call. The test database is flushed after each test, which
puts the policy back to the environment's defaults (and tests/conftest.py bumps the version
before each test, since a flush sends no signal).
"""

from __future__ import annotations

import io
import re
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
from callhelpers import EXECUTE, command, read, wait_until
from django.conf import settings
from django.core.management import call_command
from livesupport import ApiServer, free_port, git_workspace, start_api
from test_admission_capacity import held

from admission.models import CompletionLog
from admission.policy import policy_row, policy_update
from admission.queue import worker_keys
from workspaces.models import ApiKey, Principal
from workspaces.secrets import API_KEY_PREFIX, new_secret

TIMEOUT = httpx.Timeout(60.0, connect=5.0)
MESSAGE_RE = re.compile(r".* retry in (?P<n>[0-9]+) seconds\.")


def apply_policy(changes: dict[str, str]) -> None:
    """Store the change; every API process has it from its next call."""
    policy_update(changes)


def call_headers(
    account: Any, *, api_key: str | None = None, worker_id: str | None = None
) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key or account.api_key}",
        "X-LibreChat-Code-Worker-ID": worker_id or account.worker_id,
    }


def post(server: ApiServer, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        return http.post(EXECUTE, json=body, headers=headers)


def burst(
    servers: list[ApiServer],
    headers: dict[str, str],
    body: dict[str, Any],
    *,
    threads: int,
    each: int,
) -> list[httpx.Response]:
    """`threads` threads released together, thread i on servers[i % len], `each` calls in a row."""
    barrier = threading.Barrier(threads)
    results: list[list[httpx.Response]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        with httpx.Client(base_url=servers[i % len(servers)].url, timeout=TIMEOUT) as http:
            barrier.wait()
            results[i] = [http.post(EXECUTE, json=body, headers=headers) for _ in range(each)]

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return [r for per_thread in results for r in per_thread]


def assert_rate_limited(r: httpx.Response, *, limit: int) -> int:
    """The exact §3 answer; returns its wait in seconds (Retry-After == retry_after_seconds)."""
    assert r.status_code == 429, r.text
    assert r.headers["Content-Type"] == "application/json"
    retry_after = r.headers["Retry-After"]
    assert retry_after.isascii() and retry_after.isdigit() and int(retry_after) >= 1, retry_after
    assert r.headers["RateLimit-Limit"] == str(limit)
    assert r.headers["RateLimit-Remaining"] == "0"
    reset = r.headers["RateLimit-Reset"]
    # The same moment in both fields (IETF RateLimit fields draft).
    assert reset == retry_after
    body = r.json()
    assert set(body) == {"error", "message", "retry_after_seconds"}, body
    assert body["error"] == "rate_limited"
    assert body["retry_after_seconds"] == int(retry_after)
    match = MESSAGE_RE.fullmatch(body["message"])
    assert match is not None and int(match["n"]) == int(retry_after), body["message"]
    return int(retry_after)


def second_api_key(account: Any) -> str:
    principal = Principal.objects.get(tenant__name=account.tenant, name=account.user)
    raw, prefix, key_hash = new_secret(API_KEY_PREFIX)
    ApiKey.objects.create(principal=principal, prefix=prefix, key_hash=key_hash, label="second")
    return raw


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def ticket_counter(worker_id: str) -> int:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    try:
        return int(client.hget(worker_keys(settings.REDIS_KEY_PREFIX, worker_id).reg, "seq") or 0)
    finally:
        client.close()


def test_50_concurrent_calls_across_two_api_processes_let_exactly_10_through(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "10/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)

    responses = burst(api_servers, call_headers(owner), read("a"), threads=10, each=5)

    assert Counter(r.status_code for r in responses) == {200: 10, 429: 40}, [
        r.text for r in responses
    ]
    allowed = [r for r in responses if r.status_code == 200]
    assert all(r.headers["RateLimit-Limit"] == "10" for r in allowed)
    # One atomic decision per call: the ten allowed calls saw ten distinct budgets, 9 down to 0
    # (no unit refills within the 3 s a unit takes under 10/30s).
    assert sorted(int(r.headers["RateLimit-Remaining"]) for r in allowed) == list(range(10))
    for r in responses:
        if r.status_code == 429:
            # One unit comes back every 3 s; the hint is that wait, rounded up.
            assert 1 <= assert_rate_limited(r, limit=10) <= 3


def test_two_api_keys_of_one_user_share_a_budget_and_a_second_user_has_their_own(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    member = account_factory(tenant=owner.tenant, user="member")
    owner_second_key = second_api_key(owner)
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "10/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)
    first, second = api_servers

    by_first_key = [post(first, call_headers(owner), read("a")) for _ in range(6)]
    assert [r.status_code for r in by_first_key] == [200] * 6
    by_second_key = [
        post(second, call_headers(owner, api_key=owner_second_key), read("a")) for _ in range(6)
    ]
    assert [r.status_code for r in by_second_key] == [200] * 4 + [429] * 2
    assert by_second_key[0].headers["RateLimit-Remaining"] == "3"
    assert_rate_limited(by_second_key[-1], limit=10)
    assert_rate_limited(post(first, call_headers(owner), read("a")), limit=10)

    # The member calls the same worker (same tenant) with a whole budget of their own.
    as_member = call_headers(member, worker_id=owner.worker_id)
    by_member = [post(first if i % 2 else second, as_member, read("a")) for i in range(11)]
    assert [r.status_code for r in by_member] == [200] * 10 + [429]
    assert by_member[0].headers["RateLimit-Remaining"] == "9"


def test_the_call_passes_after_retry_after_seconds_and_not_just_before(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    # One unit every 2 s: the burst's first unit is back exactly 2 s after it was taken.
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "2/4s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")})
    first, second = api_servers

    burst_started = time.monotonic()
    assert [post(first, call_headers(owner), read("a")).status_code for _ in range(2)] == [200, 200]
    limited = post(second, call_headers(owner), read("a"))
    refused_at = time.monotonic()
    wait_s = assert_rate_limited(limited, limit=2)
    assert 1 <= wait_s <= 2

    # Half a second before Retry-After runs out, but never past 1.8 s from the first call:
    # Retry-After is rounded up to whole seconds, so when the three calls took over 0.4 s,
    # "half a second before" falls after the unit is back (a loaded run's failure here).
    sleep_until(min(refused_at + wait_s - 0.5, burst_started + 1.8))
    # Bound, not sleep: no unit can be back before 2 s after the first call was sent.
    assert time.monotonic() < burst_started + 1.9, (
        "the test itself ran too slowly to check 'before'"
    )
    assert_rate_limited(post(first, call_headers(owner), read("a")), limit=2)

    sleep_until(refused_at + wait_s)
    late = post(second, call_headers(owner), read("a"))
    assert late.status_code == 200, late.text
    assert late.headers["RateLimit-Remaining"] == "0"


def test_an_execute_command_of_weight_5_passes_twice_under_10_per_30s(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    row = policy_row()
    row.rate_limit = "10/30s"
    row.operation_weights = {**row.operation_weights, "execute_command": 5}
    row.full_clean()
    row.save()
    # row.save() bumps the policy version: every API process reloads on its next call.
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)

    responses = burst(api_servers, call_headers(owner), command("a", "echo hi"), threads=6, each=1)

    assert Counter(r.status_code for r in responses) == {200: 2, 429: 4}, [
        r.text for r in responses
    ]
    allowed = [r for r in responses if r.status_code == 200]
    assert all(r.json()["stdout"] == "hi\n" for r in allowed)
    assert sorted(r.headers["RateLimit-Remaining"] for r in allowed) == ["0", "5"]
    for r in responses:
        if r.status_code == 429:
            # Five units at 3 s each must come back before a command fits again.
            assert 14 <= assert_rate_limited(r, limit=10) <= 15
    # A read still weighs 1, and the budget is spent: it waits for one unit, not five.
    assert 1 <= assert_rate_limited(post(api, call_headers(owner), read("a")), limit=10) <= 3


def test_a_limited_call_leaves_a_rate_limited_completion_row(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "1/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")})
    ok_id, limited_id = "ratelimit-e2e-allowed-01", "ratelimit-e2e-limited-01"

    allowed = post(
        api, call_headers(owner) | {"X-LibreChat-Workspace-Request-Id": ok_id}, read("a")
    )
    assert allowed.status_code == 200, allowed.text
    limited = post(
        api, call_headers(owner) | {"X-LibreChat-Workspace-Request-Id": limited_id}, read("a")
    )
    assert_rate_limited(limited, limit=1)

    # Rows reach Postgres through the Redis stream the API processes drain.
    row = wait_until(
        lambda: CompletionLog.objects.filter(request_id=limited_id).first(), timeout_s=10
    )
    assert (row.http_status, row.code, row.admission_outcome) == (
        429,
        "RATE_LIMITED",
        "rate_limited",
    )
    assert (row.operation, row.worker_id, row.workspace_id) == ("read_file", owner.worker_id, "a")
    assert row.slot_index is None and row.fencing_ticket is None and row.exec_ms is None
    assert CompletionLog.objects.filter(request_id=limited_id).count() == 1
    ok_row = wait_until(
        lambda: CompletionLog.objects.filter(request_id=ok_id).first(), timeout_s=10
    )
    assert (ok_row.http_status, ok_row.admission_outcome) == (200, "admitted")
    assert ok_row.principal_hash == row.principal_hash


def test_a_refused_call_never_touches_the_workers_queue(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "3/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)
    before = ticket_counter(owner.worker_id)

    allowed = [post(api, call_headers(owner), read("a")) for _ in range(3)]
    assert [r.status_code for r in allowed] == [200] * 3
    assert ticket_counter(owner.worker_id) == before + 3

    refused = burst(api_servers, call_headers(owner), read("a"), threads=8, each=2)
    for r in refused:
        assert_rate_limited(r, limit=3)
    assert ticket_counter(owner.worker_id) == before + 3
    assert held(owner.worker_id) == []


@pytest.mark.e2e
def test_with_redis_down_the_endpoint_answers_a_typed_503_not_a_500_or_a_pass(
    live_env, account_factory
):
    owner = account_factory()
    policy_update(
        {"WORKSPACE_TOOLS_RATE_LIMIT": "120/30s", "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED": "on"}
    )
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    # A Redis of this test's own: the shared one on 6379 is never stopped.
    throwaway = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe = redis.Redis.from_url(url, socket_connect_timeout=1)
    lone: ApiServer | None = None
    try:
        wait_until(lambda: _pings(probe), timeout_s=10, interval_s=0.05)
        lone = start_api(
            live_env | {"REDIS_URL": url, "ADMISSION_REDIS_URL": url, "CELERY_BROKER_URL": url}
        )

        # Auth and policy live in Postgres, so the call reaches the limiter, which takes a unit;
        # no worker ever offered workspace "a", so the call then stops at the target check.
        reached = post(lone, call_headers(owner), read("a"))
        assert (reached.status_code, reached.json()["code"]) == (409, "WORKER_MISMATCH"), (
            reached.text
        )
        assert len(list(probe.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}rl:*"))) == 1

        throwaway.kill()
        throwaway.wait(timeout=10)
        for _ in range(3):
            started = time.monotonic()
            down = post(lone, call_headers(owner), read("a"))
            assert time.monotonic() - started < 3.0
            assert down.status_code == 503, down.text
            assert down.headers["Content-Type"] == "application/json"
            body = down.json()
            assert set(body) == {"error", "code"} and body["code"] == "ADMISSION_UNAVAILABLE"
            assert "not started" in body["error"]
    finally:
        probe.close()
        if lone is not None:
            lone.process.stop()
        if throwaway.poll() is None:
            throwaway.kill()
            throwaway.wait(timeout=10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_set_policy_enabled_off_lets_15_calls_through_under_10_per_30s(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    out = io.StringIO()
    call_command(
        "set_policy",
        "WORKSPACE_TOOLS_RATE_LIMIT=10/30s",
        "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED=off",
        stdout=out,
    )
    assert "WORKSPACE_TOOLS_RATE_LIMIT_ENABLED=off" in out.getvalue()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)

    responses = burst(api_servers, call_headers(owner), read("a"), threads=5, each=3)
    assert [r.status_code for r in responses] == [200] * 15, [r.text for r in responses]

    # Calls made while limiting was off took nothing: switched on, the whole budget is there.
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT_ENABLED": "on"})
    after = [post(api, call_headers(owner), read("a")) for _ in range(11)]
    assert [r.status_code for r in after] == [200] * 10 + [429]
    assert_rate_limited(after[-1], limit=10)


def test_a_40_call_burst_is_never_limited_under_the_default_policy(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    # The contract's default, set explicitly in case the environment configures another one.
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "120/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)

    responses = burst(api_servers, call_headers(owner), read("a"), threads=10, each=4)

    assert [r.status_code for r in responses] == [200] * 40, [r.text for r in responses]
    assert {r.headers["RateLimit-Limit"] for r in responses} == {"120"}
    # Units refill every 250 ms, so a slow burst may see some budgets twice; never below 80.
    assert all(80 <= int(r.headers["RateLimit-Remaining"]) <= 119 for r in responses)


# ---------------------------------------------------------------------------------------
# Regressions: each of these failed before its fix (request ids of refused calls, headers).


def test_a_rate_limited_call_can_be_resent_with_its_request_id_after_the_wait(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "1/1s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")})
    named = call_headers(owner) | {"X-LibreChat-Workspace-Request-Id": "ratelimit-e2e-resend-01"}

    assert post(api, call_headers(owner), read("a")).status_code == 200
    limited = post(api, named, read("a"))
    wait_s = assert_rate_limited(limited, limit=1)
    time.sleep(wait_s)
    resent = post(api, named, read("a"))
    assert resent.status_code == 200, resent.text


def test_a_rate_limited_duplicate_request_id_leaves_the_waiting_call_cancellable(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "2/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    marker = tmp_path / "never"
    waiting_id = "ratelimit-e2e-waiting-01"
    named = call_headers(owner) | {"X-LibreChat-Workspace-Request-Id": waiting_id}
    with ThreadPoolExecutor(max_workers=2) as pool:
        long = pool.submit(post, api, call_headers(owner), command("a", "sleep 2"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiting = pool.submit(post, api, named, command("a", f"touch {marker}"))
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        assert_rate_limited(post(api, named, command("a", "true")), limit=2)
        with httpx.Client(base_url=api.url, timeout=TIMEOUT) as http:
            cancelled = http.delete(
                f"/v1/workspace-tools/requests/{waiting_id}", headers=owner.auth
            )
        assert long.result().status_code == 200
        assert cancelled.json() == {"state": "cancelled"}, cancelled.text
        assert waiting.result().status_code == 409
    assert not marker.exists()


def test_an_allowed_call_that_the_worker_refuses_still_carries_the_budget_headers(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    apply_policy({"WORKSPACE_TOOLS_RATE_LIMIT": "10/30s"})
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")})

    missing = post(api, call_headers(owner), read("a", "no-such-file.txt"))
    assert (missing.status_code, missing.json()["code"]) == (422, "NOT_FOUND"), missing.text
    assert missing.headers.get("RateLimit-Remaining") == "9"
