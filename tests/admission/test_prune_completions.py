"""`manage.py prune_completions`: rows past retention go, in batches; newer rows stay."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from admission.models import CompletionLog

# The rows these tests make. The session's drainer may land rows of an earlier test of this
# process (its live API's calls) at any moment, committed by another connection: recent rows,
# which no prune here deletes, so the tests look only at their own.
OURS = {"tenant_hash": "t", "principal_hash": "p"}


def ours() -> Any:
    return CompletionLog.objects.filter(**OURS)


def completion_aged(days: float, n: int) -> CompletionLog:
    return CompletionLog.objects.create(
        uid=f"{days}-{n}",
        request_id=f"req-{days}-{n}",
        created_at=timezone.now() - timedelta(days=days),
        **OURS,
        http_status=200,
        outcome="completed",
        admission_outcome="admitted",
    )


def prune(*args: str) -> str:
    out = StringIO()
    call_command("prune_completions", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_prune_deletes_only_rows_older_than_the_retention_in_batches() -> None:
    for n in range(5):
        completion_aged(40, n)
    kept = [completion_aged(29, 0), completion_aged(0, 0)]
    # A batch of 2 means three rounds for five rows; all of them must go.
    assert (
        prune("--days", "30", "--batch-size", "2").strip()
        == "deleted 5 completion rows older than 30 days"
    )
    assert sorted(ours().values_list("pk", flat=True)) == sorted(r.pk for r in kept)


@pytest.mark.django_db
def test_prune_defaults_to_completion_retention_days(settings: Any) -> None:
    settings.COMPLETION_RETENTION_DAYS = 7
    completion_aged(8, 0)
    completion_aged(6, 0)
    assert "deleted 1 completion rows older than 7 days" in prune()
    assert ours().count() == 1


@pytest.mark.django_db
def test_prune_refuses_a_retention_below_one_day() -> None:
    completion_aged(3, 0)
    with pytest.raises(CommandError, match="--days"):
        prune("--days", "0")
    assert ours().count() == 1
