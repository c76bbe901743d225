"""An API process told to stop answers its waiting calls instead of leaving them to be cut off.

On SIGTERM or SIGINT (a deploy, a scale-down) uvicorn stops accepting connections and waits
for the requests in flight. A call still waiting in a worker's queue could wait minutes and
would then be cut off with no answer at all. Instead, from that moment:

* every call this process has waiting in a queue leaves it (`leave.lua`, which also wakes it)
  and answers `503 SERVICE_SHUTTING_DOWN`: not started, safe to send to another process;
* a call arriving on a connection still open is refused the same way;
* a call already dispatched to its worker finishes normally, and uvicorn waits for it.

The handlers are chained in front of uvicorn's own when the ASGI lifespan starts (config/asgi.py),
so uvicorn shuts down exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("sluice.admission")

MESSAGE = {"t": "shutdown"}

_state: dict[str, Any] = {"stopping": False}
# (worker id, entry id) of every call this process has waiting in a queue.
_waiting: set[tuple[str, str]] = set()


def stopping() -> bool:
    return bool(_state["stopping"])


@contextlib.contextmanager
def waiting(worker_id: str, entry_id: str) -> Iterator[None]:
    """Marks a call as waiting in its queue for as long as the block runs."""
    key = (worker_id, entry_id)
    _waiting.add(key)
    try:
        yield
    finally:
        _waiting.discard(key)


async def _sweep() -> None:
    from admission.connections import async_queue
    from admission.policy import acurrent_policy

    queue = async_queue()
    try:
        slot_ceiling = (await acurrent_policy()).max_lease_slots
    except Exception:  # Postgres away: the environment's ceiling will do for one sweep
        from admission.models import AdmissionPolicy

        slot_ceiling = AdmissionPolicy.from_env().max_lease_slots
    for worker_id, entry_id in list(_waiting):
        try:
            # A call granted meanwhile is left alone ("running"): it goes on and finishes.
            await queue.leave(
                worker_id=worker_id,
                entry_id=entry_id,
                slot_ceiling=slot_ceiling,
                message=MESSAGE,
            )
        except RedisError:
            log.warning("could not wake a waiting call for shutdown", exc_info=True)


def begin() -> asyncio.Task[None] | None:
    """Start shutting down (idempotent): refuse from now on, wake every waiting call."""
    if _state["stopping"]:
        return None
    _state["stopping"] = True
    log.warning("shutting down: waiting calls answer 503 SERVICE_SHUTTING_DOWN")
    task = asyncio.get_running_loop().create_task(_sweep())
    _state["sweep"] = task  # referenced until done
    return task


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Chain a handler for SIGTERM and SIGINT in front of the server's own."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            # Not under a server that handles the signal itself: leave its default alone.
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(begin)
            previous(signum, frame)

        signal.signal(sig, handler)
