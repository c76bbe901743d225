"""Suite-wide fixtures. The suite runs against real Postgres and real Redis only."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import quickflush
import redis
from django.conf import settings


def _check_services() -> None:
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.exit(f"Redis is not answering at {settings.REDIS_URL}: {exc}", returncode=3)
    import psycopg

    db = settings.DATABASES["default"]
    try:
        psycopg.connect(
            host=db["HOST"],
            port=db["PORT"] or None,
            user=db["USER"],
            password=db["PASSWORD"],
            dbname=db["NAME"],
            connect_timeout=3,
        ).close()
    except psycopg.Error as exc:
        pytest.exit(f"Postgres is not answering at {settings.DATABASE_URL}: {exc}", returncode=3)


def pytest_sessionstart(session: pytest.Session) -> None:
    _check_services()
    # Every run gets its own Redis namespace (queues, request ids, Celery queues, log stream),
    # so runs never see each other's keys, and neither does a local `make run`.
    settings.REDIS_KEY_PREFIX = f"test-{uuid.uuid4().hex[:8]}:"
    settings.CACHES["default"]["KEY_PREFIX"] = settings.REDIS_KEY_PREFIX + "cache"
    # The machine's shared Redis never gets an ACL user: the tests that prove the per-worker
    # users turn this on against a throwaway redis-server of their own (tests/security).
    settings.SLUICE_WORKER_REDIS_ACL = False
    settings.PASSWORD_HASHERS = ["quickhash.QuickPBKDF2PasswordHasher", *settings.PASSWORD_HASHERS]
    quickflush.install()
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {
        **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
        "global_keyprefix": settings.REDIS_KEY_PREFIX + "celery:",
    }


# Fixtures that start real API processes (uvicorn) or workers (runworker): a test using one is
# end-to-end, whatever its module says. (The last two are module fixtures of their own: the
# edge servers of tests/config/test_request_edges.py, the stack of the Postgres-outage test.)
LIVE_FIXTURES = frozenset(
    {"api_servers", "api", "worker_factory", "edge_server", "deadline_server", "outage_stack"}
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: before `-m` deselects by marker.
    for item in items:
        if LIVE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test starts: livesupport refuses to start uvicorn or runworker
    # for a test that is not marked e2e (a marker bug the unit tier would otherwise hide).
    import livesupport

    livesupport.current_test_e2e = item.get_closest_marker("e2e") is not None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    try:
        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=1000):
            client.delete(key)
    except redis.RedisError:
        pass


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    # A database of this run's own: concurrent runs on one machine never share (or drop) it.
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = f"test_sluice_{os.getpid()}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, which it drops at the end, and Postgres refuses to drop
    a database anything is still connected to: a thread of `in_db_thread`'s pool keeps its
    connection, a test's child process may outlive it. Those go first, so no run leaves its
    database behind on the machine."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _policy_follows_the_database() -> None:
    """The last test's flush emptied the policy tables behind every policy cache's back (a
    flush sends no signal): bump the version, so this process and the session's API
    processes reload the policy on their next call, as after any change."""
    from admission.policy import policy_changed

    policy_changed()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's queues."""
    return f"t:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def sync_redis(redis_prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.ADMISSION_REDIS_URL, decode_responses=True)
    yield client
    for key in client.scan_iter(match=f"{redis_prefix}*", count=1000):
        client.delete(key)
    client.close()


# ---------------------------------------------------------------------------------------
# End-to-end: real API servers (uvicorn) and real workers (runworker) on the test database.

from dataclasses import dataclass  # noqa: E402

from livesupport import ApiServer, Worker, base_env, start_api, stop_drainers, unique  # noqa: E402


@pytest.fixture(scope="session")
def live_env(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, str]]:
    """The environment of this session's API processes, workers and drainers. Its teardown
    stops the drainers (which live for the session) before the test database is dropped:
    one still connected would keep the database, and every run would leave one behind."""
    from django.db import connection

    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    host = db["HOST"] or "127.0.0.1"
    url = f"postgres://{auth}@{host}:{db['PORT'] or 5432}/{db['NAME']}"
    if host.startswith("/"):
        url = f"postgres://{auth}@/{db['NAME']}?host={host}"
    yield base_env(
        {
            "DATABASE_URL": url,
            "SLUICE_REDIS_PREFIX": settings.REDIS_KEY_PREFIX,
            "REDIS_URL": settings.REDIS_URL,
            "ADMISSION_REDIS_URL": settings.ADMISSION_REDIS_URL,
        }
    )
    stop_drainers()


@pytest.fixture(scope="session")
def api_servers(live_env: dict[str, str]) -> Iterator[list[ApiServer]]:
    servers = [start_api(live_env), start_api(live_env)]
    yield servers
    for server in servers:
        server.process.stop()


@pytest.fixture
def api(api_servers: list[ApiServer], transactional_db: None) -> ApiServer:
    return api_servers[0]


@dataclass
class Account:
    tenant: str
    user: str
    api_key: str
    worker_id: str
    worker_token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture
def account_factory(transactional_db: None) -> Any:
    from admission.management.commands.bootstrap import bootstrap

    def make(tenant: str | None = None, user: str = "owner", worker: str | None = None) -> Account:
        # Naming an existing worker gives it a new token here, so the returned account (a
        # member joining its tenant's worker, say) can start that worker.
        result = bootstrap(
            tenant=tenant or unique("tenant"),
            user=user,
            worker_id=worker or unique("w"),
            rotate_worker_token=worker is not None,
        )
        return Account(**result)

    return make


@pytest.fixture
def worker_factory(api: ApiServer, live_env: dict[str, str]) -> Iterator[Any]:
    started: list[Worker] = []

    def make(
        account: Account,
        workspaces: dict[str, Any],
        *,
        slots: int | None = None,
        lanes: bool = False,
        start: bool = True,
    ) -> Worker:
        worker = Worker(
            worker_id=account.worker_id,
            token=account.worker_token,
            workspaces=workspaces,
            api_url=api.url,
            env=live_env,
            slots=slots,
            lanes=lanes,
        )
        started.append(worker)
        return worker.start() if start else worker

    yield make
    for worker in started:
        worker.kill()
