"""The I/O a client flow asks for, and how a client answers it.

A flow (`core.py`) is a generator that yields these effects; `Client` performs them by
blocking and `AsyncClient` by awaiting, and each resumes the flow with the outcome through
`Steps`. Nothing here does I/O either.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import httpx

T = TypeVar("T")


class CancelFlag(Protocol):
    """A `threading.Event` or an `asyncio.Event`: flows only ask whether it is set."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class Mint:
    """Call the credentials source once; reply with what it returned (awaited if need be)."""


@dataclass(frozen=True)
class Send:
    """One HTTP exchange; reply with its `RawResponse`.

    Its errors are thrown back in: an `httpx.HTTPError`, or `Aborted` when the call's cancel
    flag fired while it was in flight. Only a `cancellable` send is aborted; before dropping
    the connection the client withdraws `withdraw` (a request id), if one is named.
    """

    method: str
    path: str
    body: bytes | None
    headers: dict[str, str]
    timeout: httpx.Timeout
    withdraw: str | None = None
    cancellable: bool = True


@dataclass(frozen=True)
class Sleep:
    """Wait; reply True when the wait ran out, False when the cancel flag ended it."""

    seconds: float


@dataclass(frozen=True)
class Locked:
    """Run `flow` holding the client's probe lock, so concurrent first calls share one probe;
    reply with its result."""

    flow: Flow[bool]


Effect: TypeAlias = Mint | Send | Sleep | Locked
Flow: TypeAlias = Generator[Effect, Any, T]


class Aborted(Exception):
    """Thrown into a flow at a `Send` its cancel flag aborted; `withdrawn` is Sluice's answer
    to the DELETE sent for it first, if one was."""

    def __init__(self, withdrawn: str | None = None) -> None:
        super().__init__(withdrawn)
        self.withdrawn = withdrawn


class Steps(Generic[T]):
    """Moves a flow on for a client's loop: perform `effect`, then `resume` with the outcome,
    until `effect` is None and `result` holds what the flow returned."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self.effect: Effect | None = None
        self._advance(None, None)

    @property
    def result(self) -> T:
        assert self.effect is None, "the flow has not finished"
        return self._result

    def resume(self, value: object, error: BaseException | None) -> None:
        # Called outside the client's `except`, so an error the flow raises next is not
        # chained to one it already handled.
        self._advance(value, error)

    def _advance(self, value: object, error: BaseException | None) -> None:
        try:
            self.effect = self._flow.send(value) if error is None else self._flow.throw(error)
        except StopIteration as stop:
            self.effect = None
            self._result: T = stop.value


def request_timeout(timeout_ms: int) -> httpx.Timeout:
    """An attempt's HTTP timeout: the whole budget, with at most 10 s of it to connect."""
    total_s = timeout_ms / 1000
    return httpx.Timeout(total_s, connect=min(10.0, total_s))
