"""Queue limit, slots and per-key order, end to end: real API processes, real workers, real Redis."""

from __future__ import annotations

import itertools
import time

from callhelpers import Caller, command, intervals, overlap, read, stamped, wait_until
from django.conf import settings
from livesupport import git_workspace

from admission.queue import SyncQueue, worker_keys


def held(worker_id: str) -> list[dict]:
    import redis

    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    _, entries, _ = SyncQueue(client, settings.REDIS_KEY_PREFIX).snapshot(worker_id)
    client.close()
    return entries


def test_33rd_call_gets_worker_queue_full_from_either_api_process(
    api_servers, api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    other = account_factory()
    repo = git_workspace(tmp_path / "repo")
    worker_factory(owner, {"repo": repo}, slots=2)
    worker_factory(other, {"repo": git_workspace(tmp_path / "other")}, slots=2)
    marker, release = tmp_path / "marker", tmp_path / "release"
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        # The runner holds its slot until the test lets it go, however slow the machine is.
        hold = f"while [ ! -e {release} ]; do sleep 0.05; done; touch {marker}"
        runner = caller.submit(command("repo", hold, timeout_ms=120_000))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiters = [caller.submit(read("repo"), wait_ms=4_000) for _ in range(31)]
        wait_until(lambda: len(held(owner.worker_id)) == 32)
        started = time.monotonic()
        for server in api_servers:
            r = caller.send(read("repo"), wait_ms=4_000, base_url=server.url)
            assert r.status_code == 429, r.text
            # Retry-After, also in the body: when a place is likely (admission/backlog.py).
            told = int(r.headers["Retry-After"])
            assert r.json() == {
                "error": r.json()["error"],
                "code": "WORKER_QUEUE_FULL",
                "retry_after_seconds": told,
            }
            assert 1 <= told <= 30
        # Refused at once: well inside the 4 s a waiting call would have waited.
        assert time.monotonic() - started < 3.0
        # Another worker's queue is independent.
        r = caller.send(
            read("repo"), headers=other.auth | {"X-LibreChat-Code-Worker-ID": other.worker_id}
        )
        assert r.status_code == 200, r.text
        statuses = sorted(f.result().json()["code"] for f in waiters)
        assert statuses == ["WORKSPACE_QUEUE_TIMEOUT"] * 31
        release.touch()
        assert runner.result().status_code == 200
        assert marker.exists()
    finally:
        caller.close()


def test_two_workspaces_of_one_worker_overlap_with_default_slots(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a"), "b": git_workspace(tmp_path / "b")})
    log = tmp_path / "log"
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        futures = [caller.submit(command(ws, stamped(log, ws, 1.5))) for ws in ("a", "b")]
        assert [f.result().status_code for f in futures] == [200, 200]
    finally:
        caller.close()
    spans = intervals(log)
    assert overlap(spans["a"], spans["b"])


def test_calls_on_one_workspace_never_overlap_and_run_in_arrival_order(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=4)
    log = tmp_path / "log"
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    names = [f"c{i}" for i in range(6)]
    try:
        futures = []
        for i, name in enumerate(names):
            futures.append(caller.submit(command("a", stamped(log, name, 0.3))))
            # Arrival order is entry order: wait until this call is in the queue before the next.
            # The answered calls are counted before the queue is read: a call that ends in
            # between is then in neither count (the wait goes on), never in both (a loaded
            # fresh-clone run saw c0 in the queue and answered, and sent c4 before c3 entered).
            wait_until(
                lambda n=i + 1: sum(f.done() for f in futures) + len(held(owner.worker_id)) >= n
            )
        assert [f.result().status_code for f in futures] == [200] * len(names)
    finally:
        caller.close()
    spans = intervals(log)
    ordered = sorted(names, key=lambda n: spans[n][0])
    assert ordered == names
    for first, second in itertools.pairwise(ordered):
        assert spans[first][1] <= spans[second][0]


def test_lanes_overlap_and_a_checkout_waits_for_both_and_is_not_overtaken(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    repo = git_workspace(tmp_path / "repo", lanes=("one", "two"))
    worker_factory(owner, {"repo": repo}, slots=4, lanes=True)
    log = tmp_path / "log"
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        one = caller.submit(command("repo", stamped(log, "one", 1.5), worktree="one"))
        two = caller.submit(command("repo", stamped(log, "two", 1.5), worktree="two"))
        wait_until(lambda: sum(e["st"] == "r" for e in held(owner.worker_id)) == 2)
        checkout = caller.submit(command("repo", stamped(log, "checkout", 0.5)))
        wait_until(lambda: len(held(owner.worker_id)) == 3)
        late_lane = caller.submit(command("repo", stamped(log, "late", 0.2), worktree="one"))
        results = [f.result() for f in (one, two, checkout, late_lane)]
        assert [r.status_code for r in results] == [200] * 4, [r.text for r in results]
    finally:
        caller.close()
    spans = intervals(log)
    assert overlap(spans["one"], spans["two"])
    assert spans["checkout"][0] >= max(spans["one"][1], spans["two"][1])
    assert spans["late"][0] >= spans["checkout"][1]


def test_keys_of_a_held_queue_all_carry_a_ttl(api, account_factory, worker_factory, tmp_path):
    import redis

    owner = account_factory()
    worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    caller = Caller(api.url, owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id})
    try:
        running = caller.submit(command("a", "sleep 1.5"))
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        waiting = caller.submit(read("a"))
        wait_until(lambda: len(held(owner.worker_id)) == 2)
        client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        tag = worker_keys(settings.REDIS_KEY_PREFIX, owner.worker_id).reg.rsplit(":", 1)[0]
        keys = list(client.scan_iter(match=f"{tag.replace('{', '[{]').replace('}', '[}]')}*"))
        assert len(keys) >= 3
        assert all(client.pttl(k) > 0 for k in keys)
        assert running.result().status_code == 200 and waiting.result().status_code == 200
    finally:
        caller.close()


def test_another_principals_read_passes_a_backlog_of_commands_and_its_row_says_so(
    api, account_factory, worker_factory, tmp_path
):
    from admission.models import CompletionLog
    from workspaces.access import principal_hash
    from workspaces.models import Principal

    owner = account_factory()
    member = account_factory(tenant=owner.tenant, user="member", worker=owner.worker_id)
    # Each of the owner's commands leaves its number here: what the read finds names the last
    # command that ran before it (the worker runs them one at a time).
    repo = git_workspace(tmp_path / "repo", files={"ran-last": "nothing"})
    worker_factory(member, {"repo": repo}, slots=1)
    release = tmp_path / "release"
    headers = {"X-LibreChat-Code-Worker-ID": owner.worker_id}
    mine = Caller(api.url, owner.auth | headers)
    theirs = Caller(api.url, member.auth | headers)
    try:
        hold = f"while [ ! -e {release} ]; do sleep 0.05; done"
        backlog = [mine.submit(command("repo", hold, timeout_ms=120_000))]
        wait_until(lambda: len(held(owner.worker_id)) == 1)
        for i in range(5):
            backlog.append(mine.submit(command("repo", f"printf {i} > ran-last")))
            wait_until(lambda n=i + 2: len(held(owner.worker_id)) == n)
        their_read = theirs.submit(read("repo", "ran-last"))
        wait_until(lambda: len(held(owner.worker_id)) == 7)
        release.touch()
        assert their_read.result().status_code == 200
        # The hold, then one more of the owner's (it entered the read's round first), then the
        # read: exactly one of the five ran before it.
        assert their_read.result().json()["content"] == "0"
        assert [f.result().status_code for f in backlog] == [200] * 6
    finally:
        mine.close()
        theirs.close()

    def flow_of(account):
        p = Principal.objects.get(tenant__name=account.tenant, name=account.user)
        return principal_hash(tenant_id=p.tenant_id, principal_id=p.pk)

    rows = wait_until(
        lambda: (
            found
            if len(found := list(CompletionLog.objects.filter(worker_id=owner.worker_id))) == 7
            else None
        )
    )
    (their,) = [r for r in rows if r.operation == "read_file"]
    assert their.flow_hash == flow_of(member) and their.granted_out_of_order
    assert {r.flow_hash for r in rows if r.operation != "read_file"} == {flow_of(owner)}
    assert sum(r.granted_out_of_order for r in rows) == 1
