"""`manage.py drain_completions`: move completion rows from the Redis stream into Postgres,
and write the rows durable calls owe when no API process is left to.

API processes only append each call's row to a Redis stream (one XADD, off the response
path); this process lands them in Postgres in batches. Run one or more per deployment: they
share the work through a consumer group, a row is written at most once, and the rows of a
drainer that dies are taken over by another after CLAIM_IDLE_MS. Stops on SIGTERM/SIGINT
after landing what it has read.

Beside it, every SWEEP_PERIOD_S, a sweep writes the row of every durable call that ended
without one (admission/durable.py): its accepting process died and nobody read its status;
and that of every synchronous call whose process died before it could write the row.
Any number of drainers may sweep; a claim in Redis lets exactly one write each row. The
command lives in the API app because a row records the HTTP status the synchronous endpoint
would have answered, and that table is the API edge's (api/errors.py).

The same process samples every worker's queue depth for the dashboard and keeps its 10-minute
rollup of the log (dashboard/sampler.py, dashboard/rollup.py, one thread): a deployment runs a
drainer anyway, and it is the one that knows which buckets its batches touched.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from django.core.management.base import BaseCommand

from admission.completion import CompletionDrainer
from admission.connections import sync_client
from admission.durable import SweeperThread
from admission.queue import dispatch_in_redis
from api.errors import status_of
from dashboard.rollup import Rollup
from dashboard.sampler import QueueDepthSampler


class Command(BaseCommand):
    help = "Move completion rows from the Redis stream into Postgres until stopped."

    def handle(self, *args: Any, **options: Any) -> None:
        rollup = Rollup()
        # The stream lives on the admission Redis (a cluster node, when that is a cluster).
        drainer = CompletionDrainer(
            sync_client(decode_responses=True, socket_connect_timeout=2),
            on_landed=rollup.rows_landed,
        )
        # Durable requests exist only where the scripts dispatch (never on a cluster).
        sweeper = SweeperThread(status_of=status_of) if dispatch_in_redis() else None
        sampler = QueueDepthSampler(rollup=rollup)

        def stop(signum: int, frame: Any) -> None:
            drainer.stop()
            sampler.stop()
            if sweeper is not None:
                sweeper.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if sweeper is not None:
            sweeper.start()
        sys.stdout.write(f"completion drainer {drainer.consumer} running\n")
        sys.stdout.flush()
        sampler.start()
        drainer.run()
        sampler.join(timeout=10)
        if sweeper is not None:
            sweeper.join(timeout=5)
        sys.stdout.write("completion drainer stopped\n")
