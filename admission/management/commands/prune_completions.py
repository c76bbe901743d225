"""`manage.py prune_completions [--days N]`: delete completion rows past their retention.

Deletes in batches of primary keys so no single statement holds locks on millions of rows
or bloats one transaction while API processes keep appending to the log.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from admission.models import CompletionLog


def completions_prune(*, older_than_days: int, batch_size: int) -> int:
    """Delete rows created more than `older_than_days` ago; return how many went."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted = 0
    while True:
        # Oldest first, through the created_at index; rows arriving meanwhile are all newer.
        batch = list(
            CompletionLog.objects.filter(created_at__lt=cutoff)
            .order_by("created_at")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return deleted
        count, _ = CompletionLog.objects.filter(pk__in=batch).delete()
        deleted += count


class Command(BaseCommand):
    help = "Delete completion-log rows older than COMPLETION_RETENTION_DAYS (or --days)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--days",
            type=int,
            default=None,
            help="Keep this many days [COMPLETION_RETENTION_DAYS].",
        )
        parser.add_argument("--batch-size", type=int, default=5_000)

    def handle(self, *args: Any, **options: Any) -> None:
        days = (
            options["days"] if options["days"] is not None else settings.COMPLETION_RETENTION_DAYS
        )
        if days < 1:
            raise CommandError("--days must be at least 1")
        if not 1 <= options["batch_size"] <= 100_000:
            raise CommandError("--batch-size must be within 1..100000")
        deleted = completions_prune(older_than_days=days, batch_size=options["batch_size"])
        self.stdout.write(f"deleted {deleted} completion rows older than {days} days")
