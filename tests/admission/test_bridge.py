"""The bridge lifecycle (contract §4.5) as services and routes, on real Postgres and Redis.

Cast: `owner` pairs and runs workers; `outsider` is another tenant. Time is a parameter
(`now=`), so expiry is proven with fixed clocks, never by waiting.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from admission import bridge
from admission.bridge import pairing_create, pairing_redeem, worker_revoke, worker_status
from admission.connections import sync_queue
from admission.management.commands.bootstrap import bootstrap
from admission.queue import AsyncQueue, worker_keys
from admission.refusals import Refusal
from admission.registration import OfferedWorkspace, worker_register
from workspaces.access import Caller, caller_for_api_key
from workspaces.models import Worker, WorkerPairing
from workspaces.secrets import hash_secret

pytestmark = pytest.mark.django_db(transaction=True)


class Cast:
    def __init__(self, name: str) -> None:
        self.result = bootstrap(
            tenant=f"{name}-{uuid.uuid4().hex[:6]}", user=name, worker_id=new_id(name)
        )
        caller = caller_for_api_key(self.result["api_key"])
        assert caller is not None
        self.caller: Caller = caller
        self.auth = {"Authorization": f"Bearer {self.result['api_key']}"}

    @property
    def worker_id(self) -> str:
        return str(self.result["worker_id"])


def new_id(name: str = "env") -> str:
    return f"{name}_{uuid.uuid4().hex[:12]}"


def refusal(fn: Any, **kwargs: Any) -> Refusal:
    with pytest.raises(Refusal) as caught:
        fn(**kwargs)
    return caught.value


@pytest.fixture
def owner() -> Cast:
    return Cast("owner")


@pytest.fixture
def outsider() -> Cast:
    return Cast("outsider")


def test_a_code_is_32_urlsafe_characters_kept_only_as_its_hash_and_dies_within_10_minutes(
    owner: Cast,
) -> None:
    at = timezone.now()
    pairing = pairing_create(caller=owner.caller, worker_id=new_id(), now=at)
    wire = pairing.as_json()
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", wire["code"])
    assert wire["protocolVersion"] == 1 and wire["workerId"] == pairing.worker_id
    expires = datetime.fromisoformat(wire["expiresAt"].replace("Z", "+00:00"))
    assert at < expires <= at + timedelta(minutes=10)
    row = WorkerPairing.objects.get(worker_id=pairing.worker_id)
    assert row.code_hash == hash_secret(pairing.code)
    # The clear code is nowhere in the database row.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {WorkerPairing._meta.db_table} WHERE id = %s", [row.pk])
        assert pairing.code not in repr(cursor.fetchall())
    # Pairing alone creates no worker: there is nothing to attach to until the code is redeemed.
    assert not Worker.objects.filter(worker_id=pairing.worker_id).exists()


def test_a_code_never_begins_with_a_dash(owner: Cast, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runworker --pairing-code CODE` would read such a code as an option (one in 64 did)."""
    drawn = iter(["-" + "a" * 31, "b" * 32])
    monkeypatch.setattr(bridge.secrets, "token_urlsafe", lambda _n: next(drawn))
    assert pairing_create(caller=owner.caller, worker_id=new_id()).code == "b" * 32


def test_a_code_redeems_once_and_then_says_it_was_used(owner: Cast) -> None:
    pairing = pairing_create(caller=owner.caller, worker_id=new_id())
    answer = pairing_redeem(code=pairing.code)
    assert answer["protocolVersion"] == 1 and answer["workerId"] == pairing.worker_id
    worker = Worker.objects.get(worker_id=pairing.worker_id)
    assert worker.tenant_id == owner.caller.tenant_id
    assert worker.token_hash == hash_secret(answer["workerToken"])
    assert refusal(pairing_redeem, code=pairing.code).code == "PAIRING_CODE_USED"


def test_an_expired_code_says_so_and_a_code_nobody_issued_is_unknown(owner: Cast) -> None:
    at = timezone.now()
    pairing = pairing_create(caller=owner.caller, worker_id=new_id(), now=at)
    late = at + timedelta(seconds=bridge.PAIRING_TTL_S)
    assert refusal(pairing_redeem, code=pairing.code, now=late).code == "PAIRING_CODE_EXPIRED"
    assert not Worker.objects.filter(worker_id=pairing.worker_id).exists()
    # One second earlier it still redeems.
    assert pairing_redeem(code=pairing.code, now=late - timedelta(seconds=1))["workerToken"]
    assert refusal(pairing_redeem, code="A" * 32).code == "PAIRING_CODE_UNKNOWN"


def test_a_new_code_for_an_id_replaces_the_earlier_unspent_one(owner: Cast) -> None:
    worker_id = new_id()
    first = pairing_create(caller=owner.caller, worker_id=worker_id)
    second = pairing_create(caller=owner.caller, worker_id=worker_id)
    assert refusal(pairing_redeem, code=first.code).code == "PAIRING_CODE_UNKNOWN"
    assert pairing_redeem(code=second.code)["workerId"] == worker_id


def test_of_two_concurrent_redeemers_exactly_one_wins(owner: Cast) -> None:
    rounds = 12
    codes = [pairing_create(caller=owner.caller, worker_id=new_id()).code for _ in range(rounds)]
    outcomes: dict[str, list[str]] = {code: [] for code in codes}
    lock = threading.Lock()

    def redeemer(code: str, barrier: threading.Barrier) -> None:
        barrier.wait(timeout=10)
        try:
            outcome = "token:" + pairing_redeem(code=code)["workerToken"]
        except Refusal as exc:
            outcome = exc.code
        except Exception as exc:  # shown in the assertion below, not lost in the thread
            outcome = f"error: {exc!r}"
        finally:
            connection.close()
        with lock:
            outcomes[code].append(outcome)

    for code in codes:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=redeemer, args=(code, barrier)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    for code, results in outcomes.items():
        winners = [r for r in results if r.startswith("token:")]
        assert len(winners) == 1 and results.count("PAIRING_CODE_USED") == 1, results
        worker_id = WorkerPairing.objects.get(code_hash=hash_secret(code)).worker_id
        # The token in the database is the winner's.
        assert Worker.objects.get(worker_id=worker_id).token_hash == hash_secret(winners[0][6:])


def test_pairing_an_existing_worker_again_rotates_its_token(owner: Cast) -> None:
    old = Worker.objects.get(worker_id=owner.worker_id).token_hash
    assert old == hash_secret(owner.result["worker_token"])
    pairing = pairing_create(caller=owner.caller, worker_id=owner.worker_id)
    # Until the code is spent the running worker keeps its token.
    assert Worker.objects.get(worker_id=owner.worker_id).token_hash == old
    answer = pairing_redeem(code=pairing.code)
    assert Worker.objects.get(worker_id=owner.worker_id).token_hash == hash_secret(
        answer["workerToken"]
    )


def test_the_outsider_cannot_tell_the_owners_worker_id_from_a_fresh_one_and_never_touches_it(
    owner: Cast, outsider: Cast
) -> None:
    client = Client()
    fresh = new_id()
    theirs = client.post(
        "/v1/bridge/pairings",
        {"workerId": owner.worker_id},
        content_type="application/json",
        headers=outsider.auth,
    )
    mine = client.post(
        "/v1/bridge/pairings",
        {"workerId": fresh},
        content_type="application/json",
        headers=outsider.auth,
    )
    assert theirs.status_code == mine.status_code == 200
    assert set(theirs.json()) == set(mine.json())
    # Status and revoke of both: an offline worker the outsider is pairing, byte for byte.
    for worker_id in (owner.worker_id, fresh):
        status = client.get(f"/v1/bridge/workers/{worker_id}/status", headers=outsider.auth)
        assert status.status_code == 200
        assert (
            status.content
            == json.dumps(
                {"protocolVersion": 1, "workerId": worker_id, "online": False, "ready": False},
                separators=(",", ":"),
            ).encode()
        )
    # Redeeming is the one step that can tell: the code is spent and the owner's worker untouched.
    before = Worker.objects.get(worker_id=owner.worker_id)
    assert refusal(pairing_redeem, code=theirs.json()["code"]).code == "WORKER_ID_TAKEN"
    after = Worker.objects.get(worker_id=owner.worker_id)
    assert (after.token_hash, after.tenant_id, after.revoked_at) == (
        before.token_hash,
        before.tenant_id,
        None,
    )
    revoked = client.post(f"/v1/bridge/workers/{owner.worker_id}/revoke", headers=outsider.auth)
    # The outsider's own (spent) pairing is all it revokes.
    assert revoked.status_code == 200
    assert Worker.objects.get(worker_id=owner.worker_id).token_hash == before.token_hash


def test_status_and_revoke_of_another_tenants_worker_are_byte_for_byte_a_missing_ones(
    owner: Cast, outsider: Cast
) -> None:
    client = Client()
    missing = new_id("owner")  # as long as the owner's id, so even Content-Length matches
    for verb, suffix in (("get", "status"), ("post", "revoke")):
        call = getattr(client, verb)
        theirs = call(f"/v1/bridge/workers/{owner.worker_id}/{suffix}", headers=outsider.auth)
        nobodys = call(f"/v1/bridge/workers/{missing}/{suffix}", headers=outsider.auth)
        assert theirs.status_code == nobodys.status_code == 404
        assert theirs.json()["code"] == "WORKER_NOT_FOUND"
        assert theirs.content.replace(owner.worker_id.encode(), b"X") == nobodys.content.replace(
            missing.encode(), b"X"
        )
        assert sorted(theirs.headers.items()) == sorted(nobodys.headers.items())
    assert Worker.objects.get(worker_id=owner.worker_id).revoked_at is None


def test_status_reads_the_registration_lease_and_the_offer(owner: Cast) -> None:
    worker = Worker.objects.get(worker_id=owner.worker_id)
    assert worker_status(caller=owner.caller, worker_id=owner.worker_id) == {
        "protocolVersion": 1,
        "workerId": owner.worker_id,
        "online": False,
        "ready": False,
    }
    worker_register(
        worker=worker,
        workspaces=[
            OfferedWorkspace("repo", ["execute_command", "read_file"], False),
            OfferedWorkspace("docs", ["read_file"], False),
        ],
        slots=2,
        sandbox_profile="bwrap",
    )
    status = worker_status(caller=owner.caller, worker_id=owner.worker_id)
    assert status["online"] is True and status["ready"] is True
    assert 1 <= status["leaseExpiresInMs"] <= 60_000
    assert status["capabilities"] == {
        "sandboxProfile": "bwrap",
        "runtimes": ["sh"],
        "workspaceTools": {
            "protocolVersion": 1,
            "operations": ["execute_command", "read_file"],
            "workspaces": [
                {"id": "docs", "operations": ["read_file"]},
                {"id": "repo", "operations": ["execute_command", "read_file"]},
            ],
        },
    }


def test_status_advertises_edit_features_and_one_instruction_file_the_way_librechat_reads_them(
    owner: Cast,
) -> None:
    worker = Worker.objects.get(worker_id=owner.worker_id)
    agents = {"path": "AGENTS.md", "bytes": 45, "sha256": "a" * 64}
    claude = {"path": "CLAUDE.md", "bytes": 18, "sha256": "c" * 64}
    edit_ops = ["edit_file", "preview_edit", "read_file"]
    worker_register(
        worker=worker,
        workspaces=[
            OfferedWorkspace(
                "app", edit_ops, True, ["expected_base_sha256", "replace_all", "tolerant_match"],
                [claude, agents],
            ),
            OfferedWorkspace("lib", edit_ops, False, ["replace_all", "expected_base_sha256"],
                             [claude]),
            # Offers no edits: its features do not narrow what the editing workspaces share.
            OfferedWorkspace("docs", ["read_file"], False, [], []),
        ],
        slots=2,
        sandbox_profile="bwrap",
    )  # fmt: skip
    tools = worker_status(caller=owner.caller, worker_id=owner.worker_id)["capabilities"][
        "workspaceTools"
    ]
    # Worker-wide, in the contract's order: what every editing workspace offers.
    assert tools["editFileFeatures"] == ["expected_base_sha256", "replace_all"]
    # LibreChat takes at most one instruction file per workspace (AGENTS.md first), as
    # {path, bytes, sha256, truncated}; a workspace without one has no such key.
    assert {w["id"]: w.get("instructions") for w in tools["workspaces"]} == {
        "app": [{**agents, "truncated": False}],
        "docs": None,
        "lib": [{**claude, "truncated": False}],
    }
    # Keys LibreChat's status parsers (old and new) accept, and nothing else.
    for w in tools["workspaces"]:
        assert set(w) <= {"id", "operations", "instructions"}


def test_revoke_kills_the_token_tells_waiting_and_running_calls_and_is_idempotent(
    owner: Cast,
) -> None:
    worker = Worker.objects.get(worker_id=owner.worker_id)
    worker_register(
        worker=worker, workspaces=[OfferedWorkspace("repo", ["read_file"], False)], slots=1
    )
    keys = worker_keys(settings.REDIS_KEY_PREFIX, owner.worker_id)

    async def enter_two() -> list[str]:
        client = aioredis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
        try:
            queue = AsyncQueue(client, settings.REDIS_KEY_PREFIX)
            states = []
            for entry_id in ("running", "waiting"):
                entered = await queue.enter(
                    worker_id=owner.worker_id,
                    entry_id=entry_id,
                    key=("repo", ""),
                    queue_budget_ms=30_000,
                    exec_budget_ms=30_000,
                    queue_limit=32,
                    slot_ceiling=8,
                    operation="read_file",
                )
                states.append(entered.status)
            return states
        finally:
            await client.aclose()

    assert asyncio.run(enter_two()) == ["granted", "waiting"]
    worker_revoke(caller=owner.caller, worker_id=owner.worker_id)
    client = sync_queue().client
    told = {
        entry: json.loads(client.lpop(keys.wake(entry)) or "{}")["t"]
        for entry in ("running", "waiting")
    }
    # The waiting call never started (WORKER_OFFLINE); the running one may have (unknown).
    assert told == {"running": "vanished", "waiting": "offline"}
    assert sync_queue().registration(worker_id=owner.worker_id) == (None, 0)
    revoked = Worker.objects.get(worker_id=owner.worker_id)
    assert revoked.revoked_at is not None and revoked.incarnation_id == ""
    assert revoked.token_hash != hash_secret(owner.result["worker_token"])
    response = Client().post(
        "/v1/workers/heartbeat",
        {"workerId": owner.worker_id, "incarnationId": "0" * 32},
        content_type="application/json",
        headers={"Authorization": f"Bearer {owner.result['worker_token']}"},
    )
    assert response.status_code == 401
    # LibreChat retries a revoke until it succeeds: a second one answers the same.
    worker_revoke(caller=owner.caller, worker_id=owner.worker_id)
    assert worker_status(caller=owner.caller, worker_id=owner.worker_id)["online"] is False


def test_revoke_of_an_id_only_paired_kills_its_code_and_answers_the_same_when_retried(
    owner: Cast,
) -> None:
    pairing = pairing_create(caller=owner.caller, worker_id=new_id())
    worker_revoke(caller=owner.caller, worker_id=pairing.worker_id)
    assert refusal(pairing_redeem, code=pairing.code).code == "PAIRING_CODE_EXPIRED"
    worker_revoke(caller=owner.caller, worker_id=pairing.worker_id)
    assert not Worker.objects.filter(worker_id=pairing.worker_id).exists()


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/v1/bridge/pairings", {"workerId": "bad id"}, "INVALID_WORKER_ID"),
        ("/v1/bridge/pairings", {"workerId": "ok", "x": 1}, "INVALID_REQUEST"),
        ("/v1/bridge/pairings", {"workerId": 7}, "INVALID_REQUEST"),
        (
            "/v1/bridge/pairings",
            {"workerId": "ok", "binding": {"tenantId": "t"}},
            "INVALID_REQUEST",
        ),
        (
            "/v1/bridge/pairings",
            {"workerId": "ok", "binding": {"tenantId": "t", "principal": {"type": "x", "id": "1"}}},
            "INVALID_REQUEST",
        ),
        ("/v1/bridge/pairings/redeem", {"code": "short"}, "INVALID_PAIRING_CODE"),
        ("/v1/bridge/pairings/redeem", {"code": "A" * 32, "extra": 1}, "INVALID_REQUEST"),
        ("/v1/bridge/pairings/redeem", {"code": "A" * 32, "protocolVersion": 2}, "INVALID_REQUEST"),
        ("/v1/bridge/workers/bad%20id/revoke", {}, "INVALID_WORKER_ID"),
    ],
)
def test_bad_input_is_a_typed_400_and_leaves_nothing_behind(
    owner: Cast, path: str, body: dict[str, Any], code: str
) -> None:
    before = WorkerPairing.objects.count(), Worker.objects.count()
    response = Client().post(path, body, content_type="application/json", headers=owner.auth)
    assert response.status_code == 400 and response.json()["code"] == code, response.content
    assert (WorkerPairing.objects.count(), Worker.objects.count()) == before


def test_the_bridge_routes_need_an_api_key_and_redeem_needs_none(owner: Cast) -> None:
    client = Client()
    for response in (
        client.post("/v1/bridge/pairings", {"workerId": "x"}, content_type="application/json"),
        client.get(f"/v1/bridge/workers/{owner.worker_id}/status"),
        client.post(f"/v1/bridge/workers/{owner.worker_id}/revoke"),
        client.get(
            f"/v1/bridge/workers/{owner.worker_id}/status",
            headers={"Authorization": f"Bearer {owner.result['worker_token']}"},
        ),
    ):
        assert response.status_code == 401 and response.json()["code"] == "UNAUTHENTICATED"
    pairing = client.post(
        "/v1/bridge/pairings",
        {
            "workerId": new_id(),
            "binding": {"tenantId": "lc", "principal": {"type": "user", "id": "u1"}},
        },
        content_type="application/json",
        headers=owner.auth,
    ).json()
    redeemed = client.post(
        "/v1/bridge/pairings/redeem", {"code": pairing["code"]}, content_type="application/json"
    )
    assert redeemed.status_code == 200 and redeemed.json()["workerId"] == pairing["workerId"]
    row = WorkerPairing.objects.get(worker_id=pairing["workerId"])
    assert row.binding == {"tenantId": "lc", "principal": {"type": "user", "id": "u1"}}
