"""`manage.py drain_worker W [--resume]`: stop granting a worker's queue, or grant it again.

Drained, the worker starts nothing new; its running calls finish, and waiting and new calls
stay queued within their own allowances (one that outlasts it gets the usual 503
WORKSPACE_QUEUE_TIMEOUT, not started). `--resume` grants the queue again in arrival order.
The drain lasts until resumed, through restarts; the audit trail records both.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from admission.operator import Actor, UnknownWorker, worker_drain, worker_resume


class Command(BaseCommand):
    help = "Drain a worker (grant nothing new, let running calls finish), or --resume it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker_id", metavar="WORKER_ID")
        parser.add_argument(
            "--resume", action="store_true", help="Grant the worker's queue again, in order."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        worker_id = str(options["worker_id"])
        try:
            if options["resume"]:
                was, granted = worker_resume(worker_id=worker_id, actor=Actor.shell())
                line = (
                    f"resumed worker {worker_id}; {granted} waiting call(s) granted"
                    if was
                    else f"worker {worker_id} was not drained"
                )
            else:
                changed = worker_drain(worker_id=worker_id, actor=Actor.shell())
                line = (
                    f"drained worker {worker_id}: it grants nothing new; running calls finish"
                    if changed
                    else f"worker {worker_id} is drained already"
                )
        except UnknownWorker:
            raise CommandError(f"no worker {worker_id}") from None
        except RedisError as exc:
            raise CommandError(f"cannot reach the admission Redis: {exc}") from None
        self.stdout.write(line)
