"""Completion rows survive a Postgres outage: calls made while it is down land once it is back.

A dedicated API process and worker run on a throwaway cluster (never the shared server), with
their own Redis namespace so no other API process drains their rows into another database.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from dashsupport import Calls, command, queue_entries, read, request_id, wait_until
from django.conf import settings
from livesupport import PYTHON, ROOT, ApiServer, Worker, git_workspace, start_api
from throwaway_pg import ThrowawayPostgres


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def outage_stack(live_env: dict[str, str], tmp_path: Any) -> Iterator[dict[str, Any]]:
    pg = ThrowawayPostgres()
    api: ApiServer | None = None
    worker: Worker | None = None
    try:
        pg.start()
        prefix = f"{settings.REDIS_KEY_PREFIX}pgdown-{uuid.uuid4().hex[:6]}:"
        env = live_env | {"DATABASE_URL": pg.url, "SLUICE_REDIS_PREFIX": prefix}
        _manage(env, "migrate", "--noinput")
        account = json.loads(
            _manage(
                env, "bootstrap", "--tenant", "t", "--user", "owner", "--worker", "w-pg", "--json"
            )
        )
        api = start_api(env)
        worker = Worker(
            worker_id=account["worker_id"],
            token=account["worker_token"],
            workspaces={"a": git_workspace(tmp_path / "a")},
            api_url=api.url,
            env=env,
            slots=2,
        ).start()
        yield {"pg": pg, "api": api, "account": account, "prefix": prefix}
    finally:
        if worker is not None:
            worker.kill()
        if api is not None:
            api.process.stop()
        pg.destroy()


def _rows(url: str, ids: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url, connect_timeout=3) as conn:
        found = conn.execute(
            "SELECT request_id, http_status, code, worker_id, workspace_id, operation, slot_index, "
            "admission_outcome FROM admission_completionlog WHERE request_id = ANY(%s)",
            [ids],
        ).fetchall()
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for row in found:
        rows.setdefault(row[0], []).append(row)
    return rows


def test_calls_made_while_postgres_is_down_get_a_typed_503_and_their_rows_land_once_it_is_back(
    outage_stack,
):
    pg, api, account, prefix = (outage_stack[k] for k in ("pg", "api", "account", "prefix"))
    w = account["worker_id"]
    calls = Calls(
        api.url, {"Authorization": f"Bearer {account['api_key']}", "X-LibreChat-Code-Worker-ID": w}
    )
    before_id, long_id = request_id("before-outage"), request_id("across-outage")
    down_ids = [request_id(f"during-outage{i}") for i in range(5)]
    after_id = request_id("after-outage")
    stream = redis.Redis.from_url(settings.ADMISSION_REDIS_URL)
    try:
        assert calls.send(read("a"), rid=before_id).status_code == 200
        # Admitted and dispatched before the outage, answered during it: the answer needs no Postgres.
        long = calls.submit(command("a", "sleep 2.5"), rid=long_id)
        wait_until(lambda: any(e["st"] == "r" for e in queue_entries(w, prefix)))

        pg.stop()
        stopped = time.monotonic()
        # Who the key is stays remembered for up to a second (admission/callers.py): wait until
        # the API has to ask Postgres again.
        probes = iter(range(1000))
        wait_until(
            lambda: (
                calls.send(read("a"), rid=request_id(f"probe{next(probes)}")).status_code == 503
            ),
            timeout_s=5,
            interval_s=0.2,
        )
        for rid in down_ids:
            r = calls.send(read("a"), rid=rid)
            # Authentication needs Postgres: a typed, retryable refusal, never an HTML 500.
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "DATABASE_UNAVAILABLE"
            assert "not started" in r.json()["error"] and r.headers["Retry-After"] == "5"
        assert long.result().status_code == 200
        # Every row of the outage is buffered in Redis, none is lost.
        wait_until(lambda: stream.xlen(f"{prefix}log:completions") >= 6)
        assert time.monotonic() - stopped < 15

        pg.start()
        ids = [before_id, long_id, *down_ids]
        rows = wait_until(
            lambda: (found := _rows(pg.url, ids)) and len(found) == len(ids) and found, timeout_s=20
        )
        assert {rid: len(found) for rid, found in rows.items()} == dict.fromkeys(ids, 1)
        assert rows[long_id][0][1:] == (200, "", w, "a", "execute_command", 0, "admitted")
        for rid in down_ids:
            # The row still names what was refused (worker, workspace, operation) though auth could not run.
            assert rows[rid][0][1:] == (
                503,
                "DATABASE_UNAVAILABLE",
                w,
                "a",
                "read_file",
                None,
                "rejected_before_queue",
            )

        # Back to normal: the API process reconnects by itself (a pool thread whose connection
        # broke may fail one more call before it notices).
        wait_until(
            lambda: calls.send(read("a"), rid=request_id("after-probe")).status_code == 200,
            timeout_s=10,
            interval_s=0.2,
        )
        assert calls.send(read("a"), rid=after_id).status_code == 200
        wait_until(lambda: len(_rows(pg.url, [after_id])) == 1)
    finally:
        calls.close()
        stream.close()


def test_a_malformed_stream_entry_is_dropped_and_the_rows_behind_it_land(
    transactional_db: None,
) -> None:
    import uuid

    import redis
    from django.conf import settings

    from admission.completion import CompletionDraft, CompletionDrainer, _encode, stream_key
    from admission.models import CompletionLog

    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    drainer = CompletionDrainer(client, block_ms=10)
    drainer.consumer = f"test-{uuid.uuid4().hex[:6]}"
    drainer.ensure_group()
    good = CompletionDraft(operation="read_file", outcome="completed", admission_outcome="admitted")
    good.answered(200)
    client.xadd(stream_key(), {"uid": "x" * 40, "started": "not-a-time", "http_status": "oops"})
    client.xadd(stream_key(), dict(_encode(good.row())))  # type: ignore[arg-type]
    # This drainer or the session's drainer process (same group) lands the good row; the
    # process may take a moment longer than five quick reads of this one.
    deadline = time.monotonic() + 10
    while not CompletionLog.objects.filter(uid=good.uid).exists():
        assert time.monotonic() < deadline, "the row behind the malformed entry never landed"
        drainer.drain_once()
    assert CompletionLog.objects.filter(uid=good.uid).count() == 1

    # The malformed entry is acknowledged and removed, not left to block the drain: by this
    # drainer, or by the session's drainer process (same stream and group) if that one read it.
    def malformed_gone() -> bool:
        remaining = [fields for _, fields in client.xrange(stream_key()) or [] if fields]
        return all(fields.get("uid") != "x" * 40 for fields in remaining)

    deadline = time.monotonic() + 10
    while not malformed_gone():
        assert time.monotonic() < deadline, "the malformed entry stayed in the stream"
        drainer.drain_once()
