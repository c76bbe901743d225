"""A clock a test owns, for the execute service (admission/services.py takes a `Clock`)."""

from __future__ import annotations

from collections.abc import Callable

# A wall-clock origin in ms (any fixed value does: every script computes from its now_ms).
T0_MS = 1_700_000_000_000


class FakeClock:
    """Moves only when told (`advance`). `on_read`, when set, runs at every reading of the
    clock before the reading is taken: a test does there what happens "meanwhile" (a worker
    settles, the budget runs out) at a point of the service's choosing, not of the scheduler's.
    The hook decides for itself when to act; it is not called again while it runs."""

    def __init__(self, start_ms: int = T0_MS) -> None:
        self.start_ms = start_ms
        self.elapsed_s = 0.0
        self.on_read: Callable[[], None] | None = None

    def advance(self, seconds: float) -> None:
        self.elapsed_s += seconds

    def _read(self) -> None:
        hook, self.on_read = self.on_read, None
        try:
            if hook is not None:
                hook()
        finally:
            if self.on_read is None:
                self.on_read = hook

    def now(self) -> float:
        self._read()
        return self.start_ms / 1000 + self.elapsed_s

    def monotonic(self) -> float:
        self._read()
        return 10_000.0 + self.elapsed_s

    def scripts_ms(self) -> int:
        self._read()
        return self.start_ms + round(self.elapsed_s * 1000)

    def peek_ms(self) -> int:
        """The scripts' now without running the hook (for the test's own script calls)."""
        return self.start_ms + round(self.elapsed_s * 1000)
