"""`manage.py set_policy KEY=VALUE ...`: change the admission / rate-limit policy at run time.

It edits the same rows as the admin pages: the global policy, or with `--tenant T` /
`--worker W` the override of one tenant or worker (`KEY=` with no value inherits again,
`--clear` removes the override; `--show` prints the effective policy and where each value
comes from). The save bumps the policy version in Django's cache, so
every API process has the change from its next call, without a restart (contract §1).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from admission.models import OperatorAction, PolicyOverride
from admission.operator import Actor, action_record
from admission.policy import (
    OVERRIDE_KEYS,
    POLICY_FIELDS,
    effective_policy,
    env_differences,
    parse_assignment,
    policy_override_clear,
    policy_override_update,
    policy_update,
)


def audit(target: str, result: str) -> None:
    action_record(
        actor=Actor.shell(), action=OperatorAction.POLICY, target=target, result=result[:256]
    )


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == "":
        return "(inherited)"
    return str(value)


class Command(BaseCommand):
    help = (
        "Change admission policy values, e.g. set_policy WORKER_QUEUE_LIMIT=16 WORKSPACE_TOOLS_RATE_LIMIT=60/30s. "
        f"Keys: {', '.join(POLICY_FIELDS)}. With --tenant or --worker: an override of "
        f"{', '.join(OVERRIDE_KEYS)} for that tenant or worker (KEY= inherits again). "
        "--show prints the effective policy (for --tenant or --worker if given) and where "
        "each value comes from."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("assignments", nargs="*", metavar="KEY=VALUE")
        # Not an argparse exclusive group: its refusal is a multi-line usage text, not one line.
        parser.add_argument("--tenant", metavar="NAME", help="Override for this tenant only.")
        parser.add_argument("--worker", metavar="WORKER_ID", help="Override for this worker only.")
        parser.add_argument(
            "--clear", action="store_true", help="Remove the tenant's or worker's override."
        )
        parser.add_argument(
            "--show",
            action="store_true",
            help="Print the effective policy, of --tenant or --worker if given, and where each "
            "value comes from (the worker's override, its tenant's, or the global policy).",
        )
        parser.add_argument(
            "--check-env",
            action="store_true",
            help="Only list policy variables set in the environment that the stored policy does not follow.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except DatabaseError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CommandError(f"cannot use the database: {first}") from None

    def _handle(self, options: dict[str, Any]) -> None:
        tenant, worker = options["tenant"], options["worker"]
        if tenant is not None and worker is not None:
            raise CommandError("give --tenant or --worker, not both")
        if options["show"]:
            if options["assignments"] or options["clear"]:
                raise CommandError("--show takes no KEY=VALUE and no --clear")
            try:
                rows = effective_policy(tenant=tenant, worker=worker)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            width = max(len(f"{key}={value}") for key, value, _ in rows)
            for key, value, source in rows:
                self.stdout.write(f"{f'{key}={value}':<{width}}  from {source}")
            return
        if options["check_env"]:
            lines = env_differences()
            for line in lines:
                self.stdout.write(line)
            if not lines:
                self.stdout.write(
                    "the stored policy follows every policy variable set in the environment"
                )
            return
        if options["clear"]:
            if tenant is None and worker is None:
                raise CommandError("--clear needs --tenant or --worker")
            if options["assignments"]:
                raise CommandError("--clear takes no KEY=VALUE")
            try:
                removed = policy_override_clear(tenant=tenant, worker=worker)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            who = f"tenant {tenant}" if tenant is not None else f"worker {worker}"
            if removed:
                audit(f"override of {who}", "removed")
            self.stdout.write(
                f"removed the override of {who}" if removed else f"{who} had no override"
            )
            return
        if not options["assignments"]:
            raise CommandError("give at least one KEY=VALUE")
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
        row: Any
        try:
            # All or nothing: one bad value leaves the whole policy as it was.
            if tenant is None and worker is None:
                if any(v == "" for v in changes.values()):
                    raise ValueError("the global policy has no empty values; give each KEY a value")
                row = policy_update(changes)
            else:
                row = policy_override_update(tenant=tenant, worker=worker, assignments=changes)
        except ValueError as exc:
            raise CommandError(" ".join(str(exc).split())) from None
        who = "global policy"
        if tenant is not None or worker is not None:
            who = (
                f"override of tenant {tenant}"
                if tenant is not None
                else f"override of worker {worker}"
            )
        audit(who, " ".join(f"{k}={v}" for k, v in changes.items()))
        prefix = ""
        if isinstance(row, PolicyOverride):
            prefix = f"tenant {tenant}: " if tenant is not None else f"worker {worker}: "
        for key in changes:
            self.stdout.write(f"{prefix}{key}={shown(getattr(row, POLICY_FIELDS[key]))}")
