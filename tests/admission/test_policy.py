"""The admission policy: seeded from the environment, changed with `set_policy`, live on every
API process from its next call (a version bump in Django's cache, admission/policy.py).

Commands run as real `manage.py` processes on the test database, so exit codes and stderr are
what an operator sees. The tables are flushed after each test, which also resets the policy
row to its environment defaults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest
from livesupport import ROOT, git_workspace, run_command
from sluice_protocol import OPERATIONS

from admission.models import AdmissionPolicy
from admission.policy import policy_row

POLICY_ENV = [
    "JOB_TIMEOUT",
    "WORKSPACE_QUEUE_CEILING_MS",
    "WORKER_QUEUE_LIMIT",
    "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS",
    "WORKSPACE_TOOLS_RATE_LIMIT",
]
# What a fresh process stores when it is the first to need the policy.
# The row goes and comes back in one transaction of the process under test: every other
# process of the test database (the drainer's queue-depth sampler reads the policy every 5 s)
# sees the old row until the new one is there, so none of them seeds it from its own
# environment in between.
SEED_AND_SHOW = """
import json
from django.db import transaction
from admission.models import AdmissionPolicy
from admission.policy import policy_row
with transaction.atomic():
    AdmissionPolicy.objects.all().delete()
    row = policy_row()
print(json.dumps([row.job_timeout_ms, row.queue_ceiling_ms, row.worker_queue_limit,
                  row.max_lease_slots, row.rate_limit]))
"""


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def env_without_policy(live_env: dict[str, str], **policy: str) -> dict[str, str]:
    env = {k: v for k, v in live_env.items() if k not in POLICY_ENV}
    env.update(policy)
    return env


def stored() -> list[Any]:
    row = AdmissionPolicy.objects.get(pk=1)
    return [
        row.job_timeout_ms,
        row.queue_ceiling_ms,
        row.worker_queue_limit,
        row.max_lease_slots,
        row.rate_limit,
    ]


def test_policy_row_starts_from_the_contract_defaults_when_the_environment_is_silent(
    live_env: dict[str, str], transactional_db: None
) -> None:
    done = manage(env_without_policy(live_env), "shell", "--no-imports", "-c", SEED_AND_SHOW)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [300_000, 300_000, 32, 8, "120/30s"]
    assert stored() == [300_000, 300_000, 32, 8, "120/30s"]
    row = AdmissionPolicy.objects.get(pk=1)
    assert row.rate_limit_enabled is True
    assert row.operation_weights == dict.fromkeys(sorted(OPERATIONS), 1)


def test_policy_row_starts_from_the_environment(
    live_env: dict[str, str], transactional_db: None
) -> None:
    env = env_without_policy(
        live_env,
        JOB_TIMEOUT="120000",
        WORKSPACE_QUEUE_CEILING_MS="5000",
        WORKER_QUEUE_LIMIT="7",
        CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS="3",
        WORKSPACE_TOOLS_RATE_LIMIT="60/1m",
    )
    done = manage(env, "shell", "--no-imports", "-c", SEED_AND_SHOW)
    assert done.returncode == 0, done.stderr
    assert stored() == [120_000, 5_000, 7, 3, "60/1m"]


def test_an_out_of_range_policy_variable_stops_the_process_naming_it(
    live_env: dict[str, str],
) -> None:
    done = manage(env_without_policy(live_env, WORKER_QUEUE_LIMIT="0"), "check")
    assert done.returncode != 0
    assert "WORKER_QUEUE_LIMIT" in done.stderr


def stored_after_seeding() -> list[Any]:
    policy_row()
    return stored()


@pytest.mark.parametrize(
    ("assignments", "named"),
    [
        (["NOPE=1"], "NOPE"),
        (["WORKER_QUEUE_LIMIT"], "WORKER_QUEUE_LIMIT"),
        (["WORKER_QUEUE_LIMIT=0"], "WORKER_QUEUE_LIMIT"),
        (["WORKSPACE_QUEUE_CEILING_MS=300001"], "WORKSPACE_QUEUE_CEILING_MS"),
        (
            ["CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS=65"],
            "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS",
        ),
        (["JOB_TIMEOUT=5s"], "JOB_TIMEOUT"),
        (["WORKSPACE_TOOLS_RATE_LIMIT=120/30"], "120/30"),
        # All or nothing: the good value before the bad one is not stored either.
        (["WORKER_QUEUE_LIMIT=16", "WORKSPACE_QUEUE_CEILING_MS=0"], "WORKSPACE_QUEUE_CEILING_MS"),
        (["WORKER_QUEUE_LIMIT=16", "WORKER_QUEUE_LIMIT=17"], "WORKER_QUEUE_LIMIT"),
    ],
)
def test_set_policy_refuses_a_bad_assignment_with_one_line_and_a_nonzero_exit(
    live_env: dict[str, str], transactional_db: None, assignments: list[str], named: str
) -> None:
    before = stored_after_seeding()
    done = run_command("set_policy", *assignments)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert done.stdout == ""
    assert stored() == before


def test_set_policy_stores_the_values_and_prints_them_one_per_line(
    live_env: dict[str, str], transactional_db: None
) -> None:
    done = run_command("set_policy", "WORKER_QUEUE_LIMIT=16", "WORKSPACE_TOOLS_RATE_LIMIT=60/30s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "WORKER_QUEUE_LIMIT=16",
        "WORKSPACE_TOOLS_RATE_LIMIT=60/30s",
    ]
    row = AdmissionPolicy.objects.get(pk=1)
    assert (row.worker_queue_limit, row.rate_limit) == (16, "60/30s")


def rate_limit_seen(http: httpx.Client, account: Any) -> str:
    """The rate limit one API process applies right now, as its 200 answer reports it."""
    response = http.post(
        "/v1/workspace-tools/execute",
        headers=account.auth | {"X-LibreChat-Code-Worker-ID": account.worker_id},
        json={
            "protocolVersion": 1,
            "operation": "read_file",
            "workspaceId": "repo",
            "path": "README.md",
        },
    )
    assert response.status_code == 200, response.text
    return response.headers["RateLimit-Limit"]


def test_set_policy_reaches_a_second_running_api_process_on_its_next_call(
    api_servers: list[Any],
    api: Any,
    live_env: dict[str, str],
    account_factory: Any,
    worker_factory: Any,
    tmp_path: Any,
) -> None:
    owner = account_factory()
    worker_factory(owner, {"repo": git_workspace(tmp_path / "repo")})
    second = api_servers[1]
    with second.client() as http:
        assert rate_limit_seen(http, owner) == "120"
        try:
            done = manage(live_env, "set_policy", "WORKSPACE_TOOLS_RATE_LIMIT=77/30s")
            assert done.returncode == 0, done.stderr
            # Issue 16 asks for "live within 2 s"; the version bump makes it the next call.
            assert rate_limit_seen(http, owner) == "77"
            with api.client() as first:
                assert rate_limit_seen(first, owner) == "77"
        finally:
            # Back to the defaults (the delete bumps the version too): both processes see them.
            AdmissionPolicy.objects.all().delete()
            assert rate_limit_seen(http, owner) == "120"
            with api.client() as first:
                assert rate_limit_seen(first, owner) == "120"


def test_set_policy_refuses_a_limit_below_an_operation_weight(transactional_db: None) -> None:
    from admission.policy import policy_row, policy_update

    row = policy_row()
    row.operation_weights = {**row.operation_weights, "execute_command": 10}
    row.save()
    with pytest.raises(ValueError, match="execute_command"):
        policy_update({"WORKSPACE_TOOLS_RATE_LIMIT": "5/30s"})
    assert policy_row().rate_limit == "120/30s"
    policy_update({"WORKSPACE_TOOLS_RATE_LIMIT": "10/30s"})
    assert policy_row().rate_limit == "10/30s"


def test_a_process_that_loses_the_race_to_seed_the_policy_reads_the_winners_row(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes meet the table empty (an API process and the admin, say): the one whose
    insert comes second gets the row the first one stored, not a duplicate-key error."""
    import psycopg
    from django.db import connection

    settings_dict = connection.settings_dict
    real_from_env = AdmissionPolicy.from_env
    seeded_by_the_other: list[bool] = []

    def another_process_seeds_first() -> AdmissionPolicy:
        # Between this process's read (no row) and its insert, another connection commits one.
        # (An upsert: the session's own API processes and drainer seed the row too when they
        # meet the table empty, and may have done so a moment ago; this row wins either way.)
        with psycopg.connect(
            dbname=settings_dict["NAME"],
            user=settings_dict["USER"],
            host=settings_dict["HOST"] or None,
            port=settings_dict["PORT"] or None,
            autocommit=True,
        ) as other:
            other.execute(
                "INSERT INTO admission_admissionpolicy (id, job_timeout_ms, queue_ceiling_ms,"
                " worker_queue_limit, max_lease_slots, rate_limit, rate_limit_enabled,"
                " operation_weights, updated_at) VALUES (1, 1000, 2000, 3, 4, '9/30s', true,"
                " '{}', now()) ON CONFLICT (id) DO UPDATE SET job_timeout_ms = 1000,"
                " queue_ceiling_ms = 2000, worker_queue_limit = 3, max_lease_slots = 4,"
                " rate_limit = '9/30s'"
            )
        seeded_by_the_other.append(True)
        return real_from_env()

    monkeypatch.setattr(
        AdmissionPolicy, "from_env", classmethod(lambda cls: another_process_seeds_first())
    )
    # Such a process may also seed the row between the delete and policy_row's read, and then
    # there is no race to lose: try again until policy_row met the table empty.
    for _ in range(50):
        AdmissionPolicy.objects.all().delete()
        row = policy_row()
        if seeded_by_the_other:
            break
    assert seeded_by_the_other, "policy_row never met the table empty"
    assert (row.worker_queue_limit, row.rate_limit) == (3, "9/30s")
    assert stored() == [1000, 2000, 3, 4, "9/30s"]
