"""`manage.py runworker`: run one workspace worker in the foreground (contract §1, §4)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from admission.connections import sync_queue
from config.celery import app
from workspaces import outages
from workspaces.operations.command import OWNER_ENV
from workspaces.operations.treeprocs import TreeProcesses
from workspaces.runtime import state as worker_state
from workspaces.runtime.config import (
    WorkerConfigError,
    WorkspaceRoot,
    check_limit,
    check_slots,
    default_slots,
    parse_workspaces,
    registration_workspaces,
    without_network,
)
from workspaces.runtime.consuming import Consuming, QuickReconnect
from workspaces.runtime.control import (
    ControlPlane,
    PairingRefused,
    RegistrationRefused,
    RegistrationUnanswered,
    redeem_pairing,
)
from workspaces.runtime.credfile import default_path, resolve_credentials, save_pairing
from workspaces.runtime.orphans import kill_orphans
from workspaces.sandbox import Limits, Sandbox, SandboxUnavailable, worker_sandbox
from workspaces.signing import signing_key_for_token

log = logging.getLogger("sluice.worker")
# How often a worker whose registration was lost looks whether its consumer is back.
CONSUMER_WAIT_S = 0.2


def redis_refused(exc: Exception) -> str:
    """One line for a Redis that will not have this worker, naming where (never the password)."""
    urls = {settings.ADMISSION_REDIS_URL, settings.CELERY_BROKER_URL}
    where = ", ".join(
        sorted(
            f"{p.username + '@' if p.username else ''}{p.hostname}:{p.port or 6379}"
            for p in map(urlsplit, urls)
        )
    )
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (
        f"Redis at {where} refuses this worker: {reason} If its credentials file was written "
        "before the server's Redis moved or its token was rotated, get a new one "
        "(bootstrap --rotate-worker-token, or pair again)."
    )


class Command(BaseCommand):
    help = "Run a Sluice workspace worker: register, take assignments from its queue, run them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker-id", default=None)
        parser.add_argument(
            "--credentials",
            default=None,
            metavar="FILE",
            help="0600 JSON file with worker_id, worker_token and the worker's own redis_url "
            "[default: ~/.config/sluice/worker-<id>.json when it exists]",
        )
        parser.add_argument(
            "--token",
            default=os.environ.get("SLUICE_WORKER_TOKEN"),
            help="The worker token; better given as SLUICE_WORKER_TOKEN (a command line is visible to ps).",
        )
        parser.add_argument(
            "--pairing-code",
            default=None,
            metavar="CODE",
            help="Redeem this single-use code (LibreChat's pairing) for the worker's id, token "
            "and Redis URLs, save them as the credentials file, and start.",
        )
        parser.add_argument("--workspace", action="append", default=[], metavar="ID=PATH")
        parser.add_argument("--linked-worktree-lanes", action="store_true")
        parser.add_argument(
            "--command-shared-dir",
            action="append",
            default=[],
            metavar="PATH",
            help="A directory every sandboxed command may write besides its own workspace "
            "(a build cache, say); repeatable. What one call leaves there, the next sees.",
        )
        parser.add_argument(
            "--workspace-no-network",
            action="append",
            default=[],
            metavar="ID",
            help="Commands of this workspace run without network (loopback only).",
        )
        parser.add_argument(
            "--allow-unsandboxed-commands",
            action="store_true",
            help="Offer execute_command even where bubblewrap cannot sandbox it (unsafe).",
        )
        defaults = Limits()
        for flag, default, what in (
            ("--command-max-processes", defaults.max_processes, "processes"),
            ("--command-max-file-bytes", defaults.max_file_bytes, "bytes in one file"),
            (
                "--command-max-memory-bytes",
                defaults.max_address_space_bytes,
                "bytes of address space",
            ),
        ):
            parser.add_argument(
                flag,
                type=int,
                default=default,
                help=f"Per command: at most this many {what}; 0 = no limit.",
            )
        parser.add_argument("--slots", type=int, default=None)
        parser.add_argument(
            "--api", default=os.environ.get("SLUICE_API_URL", "http://127.0.0.1:8000")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.revoked = False
        pairing = options["pairing_code"]
        if pairing is not None:
            if options["worker_id"] is not None or options["token"]:
                raise CommandError(
                    "--pairing-code brings its own worker id and token: "
                    "drop --worker-id and --token (and SLUICE_WORKER_TOKEN)"
                )
            try:
                # Before the code is spent: a worker that would refuse to start must not use it up.
                parse_workspaces(options["workspace"])
                answer = redeem_pairing(options["api"], pairing)
            except (WorkerConfigError, PairingRefused) as exc:
                raise CommandError(str(exc)) from None
            saved = save_pairing(answer, options["credentials"])
            options["credentials"] = str(saved)
            self.stdout.write(f"paired as worker {answer['workerId']}; credentials in {saved}")
        try:
            options["worker_id"], options["token"] = resolve_credentials(
                worker_id=options["worker_id"],
                token=options["token"],
                path=options["credentials"],
                celery_app=app,
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from None
        if not options["token"]:
            raise CommandError(
                "a worker token is required: set SLUICE_WORKER_TOKEN (or pass --token)"
            )
        try:
            workspaces = parse_workspaces(options["workspace"])
            slots = check_slots(
                options["slots"] if options["slots"] is not None else default_slots()
            )
            workspaces = without_network(workspaces, options["workspace_no_network"])
            for shared in options["command_shared_dir"]:
                if not os.path.isdir(shared):
                    raise WorkerConfigError(f"--command-shared-dir {shared}: no such directory")
            limits = Limits(
                max_processes=check_limit(
                    "--command-max-processes", options["command_max_processes"]
                ),
                max_file_bytes=check_limit(
                    "--command-max-file-bytes", options["command_max_file_bytes"]
                ),
                max_address_space_bytes=check_limit(
                    "--command-max-memory-bytes", options["command_max_memory_bytes"]
                ),
            )
        except WorkerConfigError as exc:
            raise CommandError(str(exc)) from None
        # Commands never see the worker's credentials file (its whole directory is hidden).
        credentials = options["credentials"] or str(default_path(options["worker_id"]))
        sandbox, workspaces = self._sandbox(
            workspaces,
            limits,
            allow_unsandboxed=options["allow_unsandboxed_commands"],
            credential_files=[os.path.expanduser(credentials)]
            if os.path.exists(os.path.expanduser(credentials))
            else [],
            shared_dirs=options["command_shared_dir"],
        )
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
            options["api"],
            worker_id=options["worker_id"],
            token=options["token"],
            sandbox_profile="bwrap" if sandbox is not None else "none",
            # Heartbeats go straight to Redis under the worker's own credentials (control.py).
            redis_beat=lambda incarnation: sync_queue().heartbeat(
                worker_id=options["worker_id"],
                incarnation=incarnation,
                ttl_ms=settings.WORKER_OFFLINE_AFTER_S * 1000,
            ),
        )

        def offered() -> list[dict[str, Any]]:
            return registration_workspaces(workspaces, lanes=lanes)

        try:
            answer = control.register(workspaces=offered(), slots=slots)
        except RegistrationRefused as exc:
            raise CommandError(str(exc)) from None
        walkers = TreeProcesses(int(answer["slots"]))
        state = worker_state.WorkerState(
            worker_id=options["worker_id"],
            incarnation=answer["incarnationId"],
            workspaces={w.workspace_id: w for w in workspaces},
            lanes=lanes,
            queue=sync_queue(),
            signing_key=signing_key_for_token(options["token"]),
            sandbox=sandbox,
            walkers=walkers,
        )
        try:
            # The worker's first use of its Redis: registering set its Redis user up.
            state.sync_clock()
            if urlsplit(settings.CELERY_BROKER_URL).scheme in ("redis", "rediss", "unix"):
                broker = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=5)
                with broker:
                    broker.ping()
        except redis.RedisError as exc:
            control.deregister(state.incarnation)
            walkers.close()
            raise CommandError(redis_refused(exc)) from None
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
        from celery.signals import worker_shutting_down

        def shutting_down(**_: Any) -> None:
            # From now on a settling thread takes no next call (assignments.py).
            state.stopping.set()

        worker_shutting_down.connect(shutting_down, weak=False)
        try:
            self._consume(answer["queue"], int(answer["slots"]))
        finally:
            stop.set()
            # Drained: Celery's warm shutdown waited for the calls that had started. A revoked
            # worker has nothing to deregister with: the revoke already took it offline.
            # Said only when it happened: a failed deregistration has logged why already.
            if not self.revoked and control.deregister(state.incarnation):
                self.stdout.write(f"worker {state.worker_id} deregistered")
            worker_state.install(None)
            walkers.close()
        if self.revoked:
            raise CommandError(
                f"worker {state.worker_id} stopped: its token is no longer accepted (revoked, "
                "rotated, or paired again elsewhere); shutting down. Pair it again to attach it."
            )

    def _sandbox(
        self,
        workspaces: list[WorkspaceRoot],
        limits: Limits,
        *,
        allow_unsandboxed: bool,
        credential_files: list[str],
        shared_dirs: list[str],
    ) -> tuple[Sandbox | None, list[WorkspaceRoot]]:
        """The sandbox for commands, and the workspaces as they will be offered: without
        execute_command when there is no sandbox, unless the operator allowed that."""
        try:
            return worker_sandbox(
                base_dir=str(settings.BASE_DIR),
                workspace_roots=[w.root for w in workspaces],
                credential_files=credential_files,
                shared_dirs=shared_dirs,
                limits=limits,
            ), workspaces
        except SandboxUnavailable as exc:
            why = str(exc)
        if allow_unsandboxed:
            log.warning(
                "commands run UNSANDBOXED (%s): they can read this worker's files, environment "
                "and processes (--allow-unsandboxed-commands)",
                why,
            )
            return None, workspaces
        log.warning(
            "execute_command is not offered: %s; install bubblewrap or pass "
            "--allow-unsandboxed-commands",
            why,
        )
        return None, [replace(w, operations=w.operations - {"execute_command"}) for w in workspaces]

    def _consume(self, queue: str, slots: int) -> None:
        from celery.signals import worker_ready

        def announce(**_: Any) -> None:
            self.stdout.write(f"worker {queue} ready")
            self.stdout.flush()

        worker_ready.connect(announce, weak=False)
        app.steps["consumer"].add(Consuming)
        if os.geteuid() == 0:
            # Celery's own 8-line warning speaks of its --uid option, which this worker does not
            # take; one line says what matters here.
            from celery.exceptions import SecurityWarning

            warnings.filterwarnings("ignore", category=SecurityWarning)
            log.warning(
                "running as root: --command-max-processes does not bind root and files that "
                "commands write belong to root; run the worker as an unprivileged user"
            )
        worker = app.Worker(
            queues=[queue],
            concurrency=slots,
            pool="threads",
            hostname=f"{queue}@%h",
            consumer_cls=QuickReconnect,
            loglevel="WARNING",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            prefetch_multiplier=1,
            quiet=True,
        )
        worker.start()

    @staticmethod
    def _consumer_back(state: worker_state.WorkerState, stop: threading.Event) -> bool:
        """Whether Celery's consumer reads the queue, waited for up to one heartbeat period
        (less if the worker stops)."""
        deadline = time.monotonic() + settings.WORKER_HEARTBEAT_S
        while not state.consuming.wait(CONSUMER_WAIT_S):
            if stop.is_set() or time.monotonic() >= deadline:
                return False
        return True

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
            # A lost registration is renewed only once Celery's consumer reads the queue
            # (runtime/consuming.py). The API's "lost" answer also set this worker's Redis user
            # up again (a Redis restarted empty has none, and the consumer logs in as it); the
            # worker asks again every heartbeat period until the consumer is back, in case
            # that failed.
            while alive == "lost" and not self._consumer_back(state, stop):
                if stop.is_set():
                    return
                alive = control.heartbeat(state.incarnation)
            if alive == "revoked":
                # handle() says why in one line once Celery has stopped.
                self.revoked = True
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if alive is False:
                log.error("this incarnation was replaced; shutting down")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if alive == "lost":
                # The registration expired or Redis restarted empty, and the consumer reads the
                # queue: come back as a new incarnation. Assignments for the old one are
                # dropped as stale from now on.
                state.registered.clear()
                try:
                    answer = control.register(workspaces=offered(), slots=slots, attempts=3)
                    state.reincarnate(answer["incarnationId"])
                except RegistrationUnanswered:
                    # Redis or the API is away again: the next heartbeat is told "lost" again.
                    log.warning("registration lost; the API did not answer, trying again later")
                    continue
                except RegistrationRefused:
                    log.error("registration lost and refused again; shutting down")
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                finally:
                    state.registered.set()
                log.warning(
                    "registration lost; registered again", extra={"incarnation": state.incarnation}
                )
            try:
                state.sync_clock()
            except Exception as exc:
                outages.warn(log, "could not read the Redis clock", exc)
