"""The test process empties the database with DELETE instead of TRUNCATE (tests/quickflush.py):
it must leave exactly what a TRUNCATE leaves, related rows included."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import IntegrityError, connection
from django.db.backends.postgresql.operations import DatabaseOperations

from admission.models import AdmissionPolicy


def _rows(model: Any) -> set[str]:
    """A table's rows, each whole (its id, its times and every value) as one comparable text."""
    return {repr(row) for row in model._default_manager.values_list()}


def test_a_flush_empties_every_table_whatever_refers_to_what(account_factory: Any) -> None:
    # A tenant, its principal, key, worker and default worker, a user: rows that refer to each
    # other both ways; then the flush a transactional test ends with.
    account_factory()
    User.objects.create_user("someone", password="x")
    try:
        AdmissionPolicy.from_env().save()
    except IntegrityError:
        # The session's API processes and drainer seed the policy row when they meet the table
        # empty; one did so between this save's UPDATE (no row yet) and its INSERT. The row the
        # flush must remove is there either way.
        assert AdmissionPolicy.objects.filter(pk=1).exists()
    before = {m: _rows(m) for m in apps.get_models()}
    assert sum(bool(rows) for rows in before.values()) >= 5
    # As a transactional test's teardown calls it: sequences go on (the command's own default
    # would restart them, and a key id that comes round again would meet an earlier test's
    # revocation mark in Redis).
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)
    # Not one row that was there is left. (The flush's post_migrate signal writes content types
    # and permissions back, as after a TRUNCATE; and the session's drainer process may write
    # rows of its own meanwhile, such as the policy seeded anew: new rows, with new ids or
    # times, which were not there before.)
    rebuilt = {"ContentType", "Permission"}
    left = {m.__name__: rows & _rows(m) for m, rows in before.items() if m.__name__ not in rebuilt}
    assert {name: rows for name, rows in left.items() if rows} == {}


def test_the_flush_deletes_and_a_sequence_reset_still_truncates() -> None:
    tables = ["admission_tenant", "auth_user"]
    assert connection.ops.sql_flush(no_style(), tables) == [
        'DELETE FROM "admission_tenant";',
        'DELETE FROM "auth_user";',
    ]
    reset = connection.ops.sql_flush(no_style(), tables, reset_sequences=True)
    assert reset[0].startswith("TRUNCATE")


def test_djangos_flush_hook_still_takes_what_quickflush_replaces() -> None:
    # A tripwire: a Django upgrade that changes the backend's flush interface fails here.
    import quickflush

    original = inspect.signature(quickflush._truncate)
    assert list(original.parameters) == [
        "self",
        "style",
        "tables",
        "reset_sequences",
        "allow_cascade",
    ]
    assert DatabaseOperations.sql_flush is quickflush.sql_flush


pytestmark = pytest.mark.django_db(transaction=True)
