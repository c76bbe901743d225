"""`manage.py set_policy KEY=VALUE ...`: change the admission / rate-limit policy at run time.

It edits the same row as the admin page. Every API process re-reads that row within
POLICY_CACHE_S, so the change is live everywhere within 2 s without a restart (contract §1).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from admission.policy import POLICY_FIELDS, parse_assignment, policy_update


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


class Command(BaseCommand):
    help = (
        "Change admission policy values, e.g. set_policy WORKER_QUEUE_LIMIT=16 WORKSPACE_TOOLS_RATE_LIMIT=60/30s. "
        f"Keys: {', '.join(POLICY_FIELDS)}."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("assignments", nargs="+", metavar="KEY=VALUE")

    def handle(self, *args: Any, **options: Any) -> None:
        changes: dict[str, str] = {}
        for text in options["assignments"]:
            try:
                key, value = parse_assignment(text)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if key in changes:
                # Which of two values wins would be a guess; make the operator say it once.
                raise CommandError(f"{key} is given more than once")
            changes[key] = value
        try:
            # All or nothing: one bad value leaves the whole policy as it was.
            row = policy_update(changes)
        except ValueError as exc:
            raise CommandError(" ".join(str(exc).split())) from None
        for key in changes:
            self.stdout.write(f"{key}={shown(getattr(row, POLICY_FIELDS[key]))}")
