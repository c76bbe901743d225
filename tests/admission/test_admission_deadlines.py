"""Deadlines, cancel, disconnect, replaced workers and crashed API processes, end to end."""

from __future__ import annotations

import json
import signal
import socket
import time
from urllib.parse import urlsplit

import pytest
from callhelpers import EXECUTE, Caller, command, read, wait_until
from livesupport import git_workspace, start_api
from test_admission_capacity import held

from admission.connections import sync_queue
from admission.models import CompletionLog, Quarantine
from admission.queue import offer_tokens
from workspaces.models import Worker, WorkerWorkspace
from workspaces.secrets import keyed_hash


def _caller(api, account) -> Caller:
    return Caller(api.url, account.auth | {"X-LibreChat-Code-Worker-ID": account.worker_id})


def test_queue_timeout_behind_a_long_command_is_503_with_retry_after_and_never_runs(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    marker = tmp_path / "never"
    caller = _caller(api, owner)
    try:
        long = caller.submit(command("a", "sleep 3"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        started = time.monotonic()
        r = caller.send(command("a", f"touch {marker}"), wait_ms=1_000)
        waited = time.monotonic() - started
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "WORKSPACE_QUEUE_TIMEOUT"
        assert "not started" in r.json()["error"]
        assert int(r.headers["Retry-After"]) >= 1
        assert 0.9 <= waited < 2.5
        assert long.result().status_code == 200
    finally:
        caller.close()
    time.sleep(0.5)
    assert not marker.exists()


def test_a_call_admitted_late_still_gets_its_whole_exec_budget(
    api, account_factory, worker_factory, tmp_path
):
    # exec budget = 7000 + 5000 = 12 s from admission. Admitted after ~6 s and running 6.5 s,
    # it would be cut at 12 s from arrival if waiting ate execution time.
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    caller = _caller(api, owner)
    try:
        long = caller.submit(command("a", "sleep 6"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        started = time.monotonic()
        r = caller.send(command("a", "sleep 6.5; echo done", timeout_ms=7_000), wait_ms=10_000)
        elapsed = time.monotonic() - started
        assert r.status_code == 200, r.text
        assert r.json()["timedOut"] is False and r.json()["stdout"] == "done\n"
        assert elapsed > 12.0
        assert long.result().status_code == 200
    finally:
        caller.close()


def _raw_post(url: str, headers: dict[str, str], body: dict) -> socket.socket:
    parts = urlsplit(url)
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(
        f"POST {EXECUTE} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n{head}\r\n".encode()
        + data
    )
    return sock


def test_a_client_that_disconnects_while_waiting_frees_its_place_within_a_second(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    marker = tmp_path / "never"
    caller = _caller(api, owner)
    try:
        long = caller.submit(command("a", "sleep 3; echo ran"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        sock = _raw_post(
            api.url,
            owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id},
            command("a", f"touch {marker}"),
        )
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        sock.close()
        closed = time.monotonic()
        wait_until(lambda: len(held(owner.worker_id)) == 1, timeout_s=1.0, interval_s=0.01)
        assert time.monotonic() - closed <= 1.0
        # The running call it waited behind is untouched.
        result = long.result()
        assert result.status_code == 200 and result.json()["stdout"] == "ran\n"
    finally:
        caller.close()
    time.sleep(0.5)
    assert not marker.exists()


def test_every_abandoned_post_leaves_exactly_one_completion_row(
    api, account_factory, worker_factory, tmp_path
):
    """Gone while waiting, and gone before its body was even read: one row each, 499."""
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    caller = _caller(api, owner)
    headers = owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    waited, unread = "abandoned-waiting-0001", "abandoned-unread-00001"
    try:
        long = caller.submit(command("a", "sleep 2"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        sock = _raw_post(
            api.url,
            headers | {"X-LibreChat-Workspace-Request-Id": waited},
            command("a", "true"),
        )
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        sock.close()
        # Headers and a promised body that never comes: the server has the request, not its body.
        parts = urlsplit(api.url)
        head = "".join(
            f"{k}: {v}\r\n"
            for k, v in (headers | {"X-LibreChat-Workspace-Request-Id": unread}).items()
        )
        with socket.create_connection((parts.hostname, parts.port)) as partial:
            partial.sendall(
                f"POST {EXECUTE} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: 1000\r\n{head}\r\n{{".encode()
            )
            time.sleep(0.2)
        assert long.result().status_code == 200
    finally:
        caller.close()

    def rows() -> list[tuple[str, int, str, str]]:
        return list(
            CompletionLog.objects.filter(request_id__in=[waited, unread])
            .order_by("request_id")
            .values_list("request_id", "http_status", "code", "worker_id")
        )

    wait_until(lambda: len(rows()) == 2, timeout_s=10)
    time.sleep(0.5)  # and no second row follows
    assert rows() == [
        (unread, 499, "CLIENT_DISCONNECTED", owner.worker_id),
        (waited, 499, "CLIENT_DISCONNECTED", owner.worker_id),
    ]


def test_delete_by_request_id_cancels_a_waiting_call_and_leaves_the_running_one(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    outsider = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    marker = tmp_path / "never"
    caller = _caller(api, owner)
    running_id, waiting_id = "running-request-0001", "waiting-request-0001"
    try:
        long = caller.submit(
            command("a", "sleep 2; echo ran"),
            headers={"X-LibreChat-Workspace-Request-Id": running_id},
        )
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiting = caller.submit(
            command("a", f"touch {marker}"),
            headers={"X-LibreChat-Workspace-Request-Id": waiting_id},
        )
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        with api.client() as http:
            # Another tenant cannot see or cancel it.
            assert (
                http.delete(
                    f"/v1/workspace-tools/requests/{waiting_id}", headers=outsider.auth
                ).status_code
                == 404
            )
            assert http.delete(
                f"/v1/workspace-tools/requests/{running_id}", headers=owner.auth
            ).json() == {"state": "running"}
            assert http.delete(
                f"/v1/workspace-tools/requests/{waiting_id}", headers=owner.auth
            ).json() == {"state": "cancelled"}
            cancelled = waiting.result()
            assert cancelled.status_code == 409 and cancelled.json()["code"] == "REQUEST_CANCELLED"
            assert long.result().json()["stdout"] == "ran\n"
            assert http.delete(
                f"/v1/workspace-tools/requests/{running_id}", headers=owner.auth
            ).json() == {"state": "finished"}
            assert (
                http.delete(
                    "/v1/workspace-tools/requests/never-seen-request-id", headers=owner.auth
                ).status_code
                == 404
            )
    finally:
        caller.close()
    assert not marker.exists()


def test_calls_waiting_for_a_restarted_worker_get_worker_offline_and_never_run(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker = worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    caller = _caller(api, owner)
    markers = [tmp_path / f"never{i}" for i in range(3)]
    try:
        long = caller.submit(command("a", "sleep 30", timeout_ms=40_000))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiting = [caller.submit(command("a", f"touch {m}")) for m in markers]
        wait_until(lambda: len(held(owner.worker_id)) == 4)
        worker.kill()
        worker.start()
        assert worker.incarnations[0] != worker.incarnations[1]
        for f in waiting:
            r = f.result()
            assert r.status_code == 503 and r.json()["code"] == "WORKER_OFFLINE", r.text
        r = long.result()
        assert r.status_code == 504 and r.json()["code"] == "ASSIGNMENT_EXPIRED"
        # The new incarnation works and never ran the old calls.
        assert caller.send(read("a")).status_code == 200
    finally:
        caller.close()
    assert not any(m.exists() for m in markers)


def test_an_api_process_killed_with_waiters_strands_no_capacity_past_their_deadlines(
    live_env, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    doomed = start_api(live_env)
    caller = Caller(doomed.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        caller.submit(command("a", "sleep 2", timeout_ms=2_000))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        for _ in range(20):
            caller.submit(read("a"), wait_ms=3_000)
        wait_until(lambda: len(held(owner.worker_id)) == 21)
        doomed.process.signal(signal.SIGKILL)
        killed = time.monotonic()
    finally:
        caller.close()
        doomed.process.kill_group()
    # Deadlines: waiters at ~3 s, the running call's exec deadline at 2 s + 5 s. Capacity is whole
    # again once they pass: the next call prunes them and 32 calls fit.
    time.sleep(max(0.0, 7.5 - (time.monotonic() - killed)))
    survivor = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        r = survivor.send(command("a", "sleep 1.5"), wait_ms=5_000)
        assert r.status_code == 200, r.text
        assert len(held(owner.worker_id)) == 0
    finally:
        survivor.close()


# " 5" is covered by client/tests/test_protocol.py: on the wire, HTTP strips a header's leading
# whitespace before any server sees it, so the value arrives as "5".
@pytest.mark.parametrize(
    "value", ["0", "007", "-5", "+5", "5.0", "1e3", "5 x", "", "abc", "300001"]
)
def test_bad_queue_wait_headers_are_refused_before_anything_is_queued(api, account_factory, value):
    owner = account_factory()
    with api.client() as http:
        r = http.post(
            EXECUTE,
            json=read("a"),
            headers=owner.auth
            | {
                "X-LibreChat-Code-Worker-ID": owner.worker_id,
                "X-LibreChat-Workspace-Queue-Wait-Ms": value,
            },
        )
    assert r.status_code == 400
    assert r.json()["code"] == "INVALID_WORKSPACE_QUEUE_WAIT"


@pytest.mark.parametrize("value", ["1", "300000"])
def test_queue_wait_headers_at_the_bounds_are_accepted(
    api, account_factory, worker_factory, tmp_path, value
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    with api.client() as http:
        r = http.post(
            EXECUTE,
            json=read("a"),
            headers=owner.auth
            | {
                "X-LibreChat-Code-Worker-ID": owner.worker_id,
                "X-LibreChat-Workspace-Queue-Wait-Ms": value,
            },
        )
    assert r.status_code == 200, r.text


def test_the_server_ceiling_clamps_a_long_queue_wait(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    from admission.policy import policy_update

    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    policy_update({"WORKSPACE_QUEUE_CEILING_MS": "1000"})  # live from the next call
    caller = _caller(api, owner)
    try:
        long = caller.submit(command("a", "sleep 4"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        started = time.monotonic()
        r = caller.send(read("a"), wait_ms=300_000)
        assert r.status_code == 503 and r.json()["code"] == "WORKSPACE_QUEUE_TIMEOUT"
        assert time.monotonic() - started < 3.0
        assert long.result().status_code == 200
    finally:
        caller.close()


def test_an_offer_withdrawn_while_waiting_gets_worker_mismatch_and_never_runs(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    marker = tmp_path / "never"
    caller = _caller(api, owner)
    try:
        long = caller.submit(command("a", "sleep 2"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiting = caller.submit(command("a", f"touch {marker}"))
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        WorkerWorkspace.objects.filter(worker__worker_id=owner.worker_id).update(
            operations=["read_file"]
        )
        # The grant checks the offer the registration keeps in Redis: withdraw it there too,
        # under the same incarnation (the waiting call stays queued, only its offer changes).
        incarnation = Worker.objects.get(worker_id=owner.worker_id).incarnation_id
        sync_queue().register_incarnation(
            worker_id=owner.worker_id,
            incarnation=incarnation,
            slots=2,
            ttl_ms=30_000,
            offer={
                "a": offer_tokens(
                    operations=["read_file"],
                    lanes=False,
                    edit_features=frozenset(),
                    instruction_files=[],
                )
            },
        )
        r = waiting.result()
        assert r.status_code == 409 and r.json()["code"] == "WORKER_MISMATCH", r.text
        assert long.result().status_code == 200
    finally:
        caller.close()
    assert not marker.exists()


def test_a_quarantined_key_is_refused_until_released(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    key_hash = keyed_hash("isolation", f"{owner.worker_id}\x1fa\x1f")
    q = Quarantine.objects.create(
        worker_id=owner.worker_id,
        workspace_id="a",
        isolation_key_hash=key_hash,
        operation="write_file",
        reason="test",
    )
    caller = _caller(api, owner)
    try:
        r = caller.send(read("a"))
        assert r.status_code == 409 and r.json()["code"] == "WORKSPACE_QUARANTINED"
        # A lane of the same workspace is another key and is not refused by this quarantine.
        q.released_at = q.created_at
        q.save()
        # A release reaches every API process within the caller cache's second.
        wait_until(lambda: caller.send(read("a")).status_code == 200, timeout_s=3, interval_s=0.2)
    finally:
        caller.close()
