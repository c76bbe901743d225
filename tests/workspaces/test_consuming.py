"""A worker that registers again after its registration was lost (a Redis restart) takes its
calls again without stranding any: it registers only while Celery's consumer reads its queue
(workspaces/runtime/consuming.py), and an assignment granted for the new incarnation before
the worker has the registration's answer waits for it instead of being dropped as stale.
Otherwise a granted call holds its slot, unsettled, until its exec deadline. Both were found as
the flake of `test_redis_restarted_empty_under_load_...`: 20 calls timed out in the queue after
the worker had registered again."""

from __future__ import annotations

import inspect
import logging
import re
import signal
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery, bootsteps
from celery.worker.consumer.consumer import Consumer
from kombu.exceptions import OperationalError
from livesupport import free_port, wait_until

from admission.queue import SyncQueue
from workspaces.management.commands.runworker import Command
from workspaces.runtime import state as worker_state
from workspaces.runtime.consuming import RECONNECT_SCHEDULE_S, Consuming, QuickReconnect
from workspaces.runtime.control import RegistrationUnanswered


class _LostOnce:
    """The control plane's two answers this rule needs: a lost registration, then alive."""

    def __init__(self) -> None:
        self.registered: list[float] = []
        self.beats = 0

    def heartbeat(self, incarnation: str) -> bool | str | None:
        self.beats += 1
        return "lost" if not self.registered else True

    def register(self, **_: Any) -> dict[str, Any]:
        self.registered.append(time.monotonic())
        return {"incarnationId": "inc2", "slots": 1, "queue": "q"}


def _state(sync_redis: redis.Redis, redis_prefix: str) -> worker_state.WorkerState:
    return worker_state.WorkerState(
        worker_id="w",
        incarnation="inc1",
        workspaces={},
        lanes=False,
        queue=SyncQueue(sync_redis, redis_prefix),
        signing_key=b"k",
    )


def _beating(
    state: worker_state.WorkerState,
) -> tuple[_LostOnce, threading.Event, threading.Thread]:
    """runworker's real heartbeat loop, on its own thread, told once that it is lost."""
    control, stop = _LostOnce(), threading.Event()
    beat = threading.Thread(
        target=Command()._heartbeat, args=(control, state, stop, list, 1), daemon=True
    )
    beat.start()
    return control, stop, beat


def test_a_lost_registration_is_renewed_only_once_the_consumer_reads_the_queue(
    sync_redis: redis.Redis, redis_prefix: str, settings: Any
) -> None:
    settings.WORKER_HEARTBEAT_S = 0.01
    state = _state(sync_redis, redis_prefix)
    control, stop, beat = _beating(state)
    try:
        wait_until(lambda: control.beats >= 1)
        time.sleep(0.3)  # the rule is that nothing happens: give it time to (wrongly) happen
        assert control.registered == []
        state.consuming.set()  # the consumer is back
        wait_until(lambda: control.registered)
        wait_until(lambda: state.incarnation == "inc2")
    finally:
        stop.set()
        beat.join(timeout=5)
    assert not beat.is_alive()


def test_a_lost_worker_keeps_telling_the_api_while_its_consumer_is_away(
    sync_redis: redis.Redis, redis_prefix: str, settings: Any
) -> None:
    """Each "lost" answer sets the worker's Redis user up again (admission/registration.py),
    the user its consumer logs in as: asked once only, a failed restore would leave the
    consumer locked out for good."""
    settings.WORKER_HEARTBEAT_S = 0.01
    state = _state(sync_redis, redis_prefix)
    control, stop, beat = _beating(state)
    try:
        wait_until(lambda: control.beats >= 5)
        assert control.registered == []
    finally:
        stop.set()
        beat.join(timeout=5)


class _UnansweredOnce(_LostOnce):
    """The first registration finds the API unable to answer (Redis away again)."""

    def register(self, **kw: Any) -> dict[str, Any]:
        self.registered.append(time.monotonic())
        if len(self.registered) == 1:
            raise RegistrationUnanswered("the API did not accept the registration; giving up")
        return {"incarnationId": "inc2", "slots": 1, "queue": "q"}

    def heartbeat(self, incarnation: str) -> bool | str | None:
        self.beats += 1
        return True if incarnation == "inc2" else "lost"


def test_a_registration_the_api_cannot_answer_is_tried_again_without_stopping_the_worker(
    sync_redis: redis.Redis, redis_prefix: str, settings: Any
) -> None:
    settings.WORKER_HEARTBEAT_S = 0.01
    state = _state(sync_redis, redis_prefix)
    state.consuming.set()
    terms: list[int] = []
    # The loop stops its own process with SIGTERM when it gives up: recorded here instead.
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: terms.append(signum))
    control, stop = _UnansweredOnce(), threading.Event()
    beat = threading.Thread(
        target=Command()._heartbeat, args=(control, state, stop, list, 1), daemon=True
    )
    beat.start()
    try:
        wait_until(lambda: state.incarnation == "inc2")
        assert len(control.registered) == 2 and terms == []
        assert state.registered.is_set()
    finally:
        stop.set()
        beat.join(timeout=5)
        signal.signal(signal.SIGTERM, previous)


def test_a_worker_stopping_while_its_consumer_is_away_does_not_register_again(
    sync_redis: redis.Redis, redis_prefix: str, settings: Any
) -> None:
    settings.WORKER_HEARTBEAT_S = 0.01
    control, stop, beat = _beating(_state(sync_redis, redis_prefix))
    wait_until(lambda: control.beats >= 1)
    stop.set()
    beat.join(timeout=5)
    assert not beat.is_alive() and control.registered == []


def test_the_consumer_step_marks_the_worker_consuming_while_it_runs(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    state = _state(sync_redis, redis_prefix)
    worker_state.install(state)
    try:
        step = Consuming(parent=None)
        step.start(None)
        assert state.consuming.is_set()
        step.stop(None)  # the connection was lost: the blueprint stops every step
        assert not state.consuming.is_set()
        step.start(None)
        step.shutdown(None)
        assert not state.consuming.is_set()
    finally:
        worker_state.install(None)


def test_celery_stops_the_consumers_steps_when_its_connection_is_lost() -> None:
    """Tripwire on what the step leans on: Celery's consumer restarts its blueprint (every
    step's `stop`, then `start` once connected again) after a connection error."""
    source = inspect.getsource(Consumer.start)
    assert "except self.connection_errors" in source or "connection_errors" in source
    assert "blueprint.restart(self)" in source
    restart = inspect.signature(bootsteps.Blueprint.restart)
    assert restart.parameters["method"].default == "stop"


def test_an_assignment_for_the_incarnation_being_registered_waits_for_it(
    sync_redis: redis.Redis, redis_prefix: str
) -> None:
    """The API grants for a new incarnation as soon as it has written it, before the worker
    has the registration's answer: such an assignment is judged once the worker has adopted
    the incarnation, not dropped as stale (its slot would stay taken, unsettled, until its exec
    deadline: the calls behind it timed out in the queue after a Redis restart)."""
    from workspaces.runtime.assignments import _run_one
    from workspaces.signing import sign

    state = _state(sync_redis, redis_prefix)
    state.registered.clear()  # registering again, the answer not in yet
    message: dict[str, Any] = {"assignmentId": "e1", "incarnation": "inc2", "workerId": "w"}
    message["sig"] = sign(state.signing_key, "assignment", message)
    judged = threading.Thread(target=_run_one, args=(state, message, None), daemon=True)
    judged.start()
    time.sleep(0.2)  # the rule is that nothing happens: give it time to (wrongly) happen
    assert judged.is_alive() and state.dropped["stale"] == 0
    state.reincarnate("inc2")
    state.registered.set()
    judged.join(timeout=5)
    assert not judged.is_alive()
    # Judged under inc2: not stale; dropped only because this test granted it nothing.
    assert state.dropped["stale"] == 0 and state.dropped["expired"] == 1


def test_the_consumer_retries_the_broker_every_few_seconds_not_kombus_30(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Celery's own reconnection, on a real broker URL where nothing listens, with the worker's
    consumer class: the waits between tries follow RECONNECT_SCHEDULE_S (kombu's own would be
    2 and 4 s here, growing to 30). Pins the call QuickReconnect adds its schedule to."""
    assert "conn.ensure_connection(" in inspect.getsource(Consumer.ensure_connected)
    app = Celery(set_as_current=False)
    app.conf.broker_connection_max_retries = 2
    # Only what ensure_connected reads of a consumer: a whole one needs a running worker.
    consumer = object.__new__(QuickReconnect)
    consumer.app = app
    consumer.first_connection_attempt = False
    consumer.broker_connection_retry_attempt = 0
    conn = app.connection_for_read(f"redis://127.0.0.1:{free_port()}/0")
    with caplog.at_level(logging.ERROR), pytest.raises(OperationalError):
        consumer.ensure_connected(conn)
    waits = re.findall(r"Trying again in ([0-9.]+) seconds?", caplog.text)
    start, step = RECONNECT_SCHEDULE_S["interval_start"], RECONNECT_SCHEDULE_S["interval_step"]
    assert [float(w) for w in waits] == [start, start + step]
    assert RECONNECT_SCHEDULE_S["interval_max"] <= 2.0


def test_the_worker_retries_the_broker_for_as_long_as_redis_is_away() -> None:
    """kombu's ensure_connection retries forever when max_retries is None; Celery's default of
    100 tries ends a worker after about 200 s of Redis outage at the quick reconnect's pace."""
    from config.celery import app

    assert app.conf.broker_connection_max_retries is None
