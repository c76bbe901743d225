"""Whether Celery's consumer is taking this worker's queue (WorkerState.consuming), and how
soon it reconnects.

A worker whose registration was lost could come back, through the heartbeat, before Celery's
consumer reads its queue again: every call granted in between was dispatched to a queue nobody
read, and held its slot until its exec deadline (30 s for a read) while the calls behind it
timed out in the queue. So the heartbeat registers a lost registration again only while the
consumer is connected; until then the worker's calls are refused WORKER_OFFLINE at once (not
started).

That makes the consumer's reconnection the worker's way back, so it tries every 1 to 2 s
(QuickReconnect) rather than with kombu's back-off, which grows to 30 s between tries (Celery
passes no setting for it): after a Redis restart the worker would otherwise be away for up
to half a minute after Redis and its own Redis user (set up again by the API's heartbeat
answer, admission/registration.py) were back.

The consumer's blueprint starts its steps once the broker connection is made and the task
consumer is set up, and stops them all when the connection is lost, before it reconnects
(celery.worker.consumer.Consumer.start, `blueprint.restart`):
`tests/workspaces/test_consuming.py` pins that.
"""

from __future__ import annotations

import functools
from typing import Any

from celery import bootsteps
from celery.worker.consumer.consumer import Consumer

from workspaces.runtime import state as worker_state

# kombu's retry schedule for the broker connection: the first wait, its growth per try, the
# most between two tries (seconds).
RECONNECT_SCHEDULE_S = {"interval_start": 1.0, "interval_step": 1.0, "interval_max": 2.0}


class QuickReconnect(Consumer):
    """Celery's consumer, retrying the broker on RECONNECT_SCHEDULE_S.

    Celery connects through `conn.ensure_connection(errback, max_retries, callback=...)`, a
    fresh connection each time; the schedule is added to that one call.
    `tests/workspaces/test_consuming.py` pins both."""

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **RECONNECT_SCHEDULE_S)
        return super().ensure_connected(conn)


class Consuming(bootsteps.StartStopStep):
    """A consumer step: sets the worker's `consuming` flag while the consumer runs."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        _mark(consuming=True)

    def stop(self, parent: Any) -> None:
        _mark(consuming=False)

    def shutdown(self, parent: Any) -> None:
        _mark(consuming=False)


def _mark(*, consuming: bool) -> None:
    state = worker_state.current()
    if state is not None:
        if consuming:
            state.consuming.set()
        else:
            state.consuming.clear()
