"""`manage.py cancel_call REQUEST_ID`: cancel one waiting call of any principal (contract §2.6).

Exactly as the client's own DELETE of the request id: the call leaves its queue and its
request answers 409 REQUEST_CANCELLED, not started; its completion row says an operator did
it, and the audit trail records the cancel. A running or finished call is untouched.
Exit status: 0 cancelled, 1 unknown request id, 2 running or finished (nothing done).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError
from sluice_protocol import ProtocolError, validate_request_id

from admission.operator import Actor, request_cancel

ANSWERS = {
    "cancelled": "cancelled the waiting call {rid}; it answers REQUEST_CANCELLED, not started",
    "running": "call {rid} is running; it was not cancelled (a running call is never touched)",
    "finished": "call {rid} has finished; nothing to cancel",
}


class Command(BaseCommand):
    help = "Cancel one waiting call by its request id (X-LibreChat-Workspace-Request-Id)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("request_id", metavar="REQUEST_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        rid = str(options["request_id"])
        try:
            validate_request_id(rid)
        except ProtocolError:
            raise CommandError(f"no call has request id {rid!r}") from None
        try:
            state = request_cancel(request_id=rid, actor=Actor.shell())
        except RedisError as exc:
            raise CommandError(f"cannot reach the admission Redis: {exc}") from None
        if state == "unknown":
            raise CommandError(f"no waiting or running call has request id {rid}")
        self.stdout.write(ANSWERS[state].format(rid=rid))
        if state != "cancelled":
            sys.exit(2)
