"""Typed failures of workspace operations, and the deadline check every long loop uses.

Kept apart from ``__init__`` so the operation modules can import it without a cycle; the
package re-exports both classes, so callers write ``from workspaces.operations import
OperationError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class OperationError(Exception):
    """The worker ran or refused the call; ``code`` is a §2.5 worker code.

    ``message`` is a short sentence that names only workspace-relative paths: it travels to
    the API client, and a host path in it would leak the worker's layout.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class OutcomeUnknown(OperationError):
    """A mutation was started and the worker cannot tell whether it took effect.

    The caller must quarantine the isolation key: retrying could apply the change twice, and
    reporting a clean failure could hide a half-applied one. Raised with code
    ``WRITE_UNAVAILABLE`` by writes and edits, ``COMMAND_UNAVAILABLE`` by a command whose
    output could not be collected after it started.
    """


def check_deadline(deadline: float, code: str) -> None:
    """Raise ``code`` once ``time.monotonic()`` has passed ``deadline``.

    Past the deadline the API has already answered the client, so any further work is
    wasted and, for a mutation, would land after the client was told the outcome is unknown.
    """
    if time.monotonic() >= deadline:
        raise past_deadline(code)


def past_deadline(code: str) -> OperationError:
    """What a call that ran past its deadline is refused with, as ``code``."""
    return OperationError(code, "The operation ran past its deadline.")


# Items a paced loop handles between two looks at the clock: a few milliseconds of Python work.
PACE_EVERY = 4096


class Pace:
    """The call's deadline as a long computation checks it, and a count of the steps it took.

    ``check`` raises ``code`` once ``clock()`` has passed ``deadline``; ``paced`` wraps a loop so
    it looks at the clock every PACE_EVERY items. ``steps`` counts the items paced loops handled
    (tests read it as the computation's cost, and inject ``clock`` to stand in for time).
    """

    def __init__(
        self,
        deadline: float,
        code: str,
        message: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline = deadline
        self.code = code
        self.message = message
        self.clock = clock
        self.steps = 0

    def check(self) -> None:
        if self.clock() >= self.deadline:
            raise OperationError(self.code, self.message)

    def paced(self, items: Iterable[T]) -> Iterator[T]:
        count = 0
        try:
            for item in items:
                count += 1
                if count == PACE_EVERY:
                    self.steps += count
                    count = 0
                    self.check()
                yield item
        finally:
            self.steps += count
