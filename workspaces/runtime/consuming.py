"""Whether Celery's consumer is taking this worker's queue (WorkerState.consuming).

After the broker went away, Celery's consumer reconnects with kombu's growing back-off (2, 4,
6, ... s, at most 30 s between tries; Celery passes no setting for it). The worker's
registration comes back sooner, through the heartbeat, once Redis answers again: every call
granted in between was dispatched to a queue nobody read, and held its slot until its exec
deadline (30 s for a read) while the calls behind it timed out in the queue. So the heartbeat
registers a lost registration again only while the consumer is connected; until then the
worker's calls are refused WORKER_OFFLINE at once (not started).

The consumer's blueprint starts its steps once the broker connection is made and the task
consumer is set up, and stops them all when the connection is lost, before it reconnects
(celery.worker.consumer.Consumer.start, `blueprint.restart`):
`tests/workspaces/test_consuming.py` pins that.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from workspaces.runtime import state as worker_state


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
