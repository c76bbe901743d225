"""`manage.py runworker`: run one workspace worker in the foreground (contract §1, §4)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from admission.connections import sync_queue
from config.celery import app
from workspaces.operations.command import OWNER_ENV
from workspaces.runtime import state as worker_state
from workspaces.runtime.config import (
    WorkerConfigError,
    check_slots,
    default_slots,
    parse_workspaces,
    registration_workspaces,
)
from workspaces.runtime.control import ControlPlane, RegistrationRefused
from workspaces.runtime.orphans import kill_orphans
from workspaces.signing import signing_key_for_token

log = logging.getLogger("sluice.worker")


class Command(BaseCommand):
    help = "Run a Sluice workspace worker: register, take assignments from its queue, run them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker-id", required=True)
        parser.add_argument(
            "--token",
            default=os.environ.get("SLUICE_WORKER_TOKEN"),
            help="The worker token; better given as SLUICE_WORKER_TOKEN (a command line is visible to ps).",
        )
        parser.add_argument("--workspace", action="append", default=[], metavar="ID=PATH")
        parser.add_argument("--linked-worktree-lanes", action="store_true")
        parser.add_argument("--slots", type=int, default=None)
        parser.add_argument(
            "--api", default=os.environ.get("SLUICE_API_URL", "http://127.0.0.1:8000")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["token"]:
            raise CommandError(
                "a worker token is required: set SLUICE_WORKER_TOKEN (or pass --token)"
            )
        try:
            workspaces = parse_workspaces(options["workspace"])
            slots = check_slots(
                options["slots"] if options["slots"] is not None else default_slots()
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from None
        if len(workspaces) > 1 and slots == 1:
            log.warning(
                "%d workspaces share 1 slot: calls on different workspaces will wait for each other",
                len(workspaces),
            )
        lanes = bool(options["linked_worktree_lanes"])
        worker_id = options["worker_id"]
        # Before registering: nothing an earlier run of this worker left may still be running
        # when the new incarnation takes its first call.
        _, left = kill_orphans(worker_id)
        if left:
            raise CommandError(
                f"processes an earlier run of worker {worker_id} left are still alive after "
                f"SIGKILL (pids {', '.join(map(str, left))}); not starting beside them"
            )
        os.environ[OWNER_ENV] = worker_id
        control = ControlPlane(
            options["api"], worker_id=options["worker_id"], token=options["token"]
        )

        def offered() -> list[dict[str, Any]]:
            return registration_workspaces(workspaces, lanes=lanes)

        try:
            answer = control.register(workspaces=offered(), slots=slots)
        except RegistrationRefused as exc:
            raise CommandError(str(exc)) from None
        state = worker_state.WorkerState(
            worker_id=options["worker_id"],
            incarnation=answer["incarnationId"],
            workspaces={w.workspace_id: w for w in workspaces},
            lanes=lanes,
            queue=sync_queue(),
            signing_key=signing_key_for_token(options["token"]),
        )
        state.sync_clock()
        worker_state.install(state)
        self.stdout.write(
            f"worker {state.worker_id} registered: incarnation {state.incarnation}, "
            f"slots {answer['slots']}, queue {answer['queue']}, workspaces {len(workspaces)}",
        )
        self.stdout.flush()
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(control, state, stop, offered, slots), daemon=True
        )
        beat.start()
        try:
            self._consume(answer["queue"], int(answer["slots"]))
        finally:
            stop.set()
            # Drained: Celery's warm shutdown waited for the calls that had started.
            control.deregister(state.incarnation)
            worker_state.install(None)
            self.stdout.write(f"worker {state.worker_id} deregistered")

    def _consume(self, queue: str, slots: int) -> None:
        from celery.signals import worker_ready

        def announce(**_: Any) -> None:
            self.stdout.write(f"worker {queue} ready")
            self.stdout.flush()

        worker_ready.connect(announce, weak=False)
        worker = app.Worker(
            queues=[queue],
            concurrency=slots,
            pool="threads",
            hostname=f"{queue}@%h",
            loglevel="WARNING",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            prefetch_multiplier=1,
            quiet=True,
        )
        worker.start()

    def _heartbeat(
        self,
        control: ControlPlane,
        state: worker_state.WorkerState,
        stop: threading.Event,
        offered: Callable[[], list[dict[str, Any]]],
        slots: int,
    ) -> None:
        while not stop.wait(settings.WORKER_HEARTBEAT_S):
            alive = control.heartbeat(state.incarnation)
            if alive is False:
                log.error("this incarnation was replaced (or its token rotated); shutting down")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if alive == "lost":
                # The registration expired or Redis restarted empty: come back as a new
                # incarnation. Assignments for the old one are dropped as stale from now on.
                try:
                    answer = control.register(workspaces=offered(), slots=slots, attempts=3)
                except RegistrationRefused:
                    log.error("registration lost and refused again; shutting down")
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                state.reincarnate(answer["incarnationId"])
                log.warning(
                    "registration lost; registered again", extra={"incarnation": state.incarnation}
                )
            try:
                state.sync_clock()
            except Exception:
                log.warning("could not read the Redis clock", exc_info=True)
