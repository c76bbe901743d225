"""The tickets a worker has run (workspaces/runtime/state.py `Tickets`): a redelivery is
refused while its ticket is remembered, a ticket is never forgotten before its time, memory
holds only tickets whose time has not passed, and a look costs the same however many are
remembered. A fake clock; no Redis needed."""

from __future__ import annotations

from typing import Any, cast

from workspaces.runtime.state import TICKET_MARGIN_S, Tickets, WorkerState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_redelivery_is_refused_while_its_ticket_is_remembered() -> None:
    clock = Clock()
    tickets = Tickets(clock=clock)
    assert tickets.first_sight(7, remember_s=60)
    clock.now += 59.75
    assert not tickets.first_sight(7, remember_s=60)
    assert tickets.first_sight(8, remember_s=60)
    assert not tickets.first_sight(8, remember_s=60)


def test_tickets_are_forgotten_oldest_first_after_their_time() -> None:
    clock = Clock()
    tickets = Tickets(clock=clock)
    for ticket in range(100):
        assert tickets.first_sight(ticket, remember_s=60)
        clock.now += 1.0
    # Now 1100: tickets first seen at 1040 or before (0..40) have had their 60 s.
    assert tickets.first_sight(1000, remember_s=60)
    assert len(tickets) == 60  # 41..99 and 1000
    assert not tickets.first_sight(41, remember_s=60)  # first seen at 1041: kept until 1101
    assert tickets.first_sight(
        0, remember_s=60
    )  # forgotten: new (a redelivery this late is expired)


def test_a_ticket_behind_a_longer_lived_one_is_never_forgotten_early() -> None:
    clock = Clock()
    tickets = Tickets(clock=clock)
    assert tickets.first_sight(1, remember_s=300)  # a command's budget
    assert tickets.first_sight(2, remember_s=30)  # a read's
    clock.now += 100
    assert tickets.first_sight(3, remember_s=30)
    # 2's time has passed, but it waits behind 1: kept longer, never shorter.
    assert not tickets.first_sight(1, remember_s=300)
    assert not tickets.first_sight(2, remember_s=30)
    clock.now += 201
    assert tickets.first_sight(4, remember_s=30)
    assert len(tickets) == 1  # 1, 2 and 3 have all had their time


def test_a_look_costs_the_same_however_many_tickets_are_remembered() -> None:
    clock = Clock()
    tickets = Tickets(clock=clock)
    # 1,250 s at 4 calls/s: 5,000 remembered (an hour at 100 calls/s would be 360,000).
    for ticket in range(5_000):
        tickets.first_sight(ticket, remember_s=1250)
        clock.now += 0.25
    before = tickets.examined
    for ticket in range(5_000, 6_000):
        assert tickets.first_sight(ticket, remember_s=1250)
        clock.now += 0.25
    # Each look forgets the ticket whose time passed since the last (one a call in the steady
    # state) and stops at the first remembered: a scan of them all would be 5,000 a look.
    assert tickets.examined - before <= 2 * 1000
    assert len(tickets) == 5_000


def test_the_worker_remembers_a_ticket_past_its_deadline_and_forgets_it_after() -> None:
    state = WorkerState(
        worker_id="w",
        incarnation="i",
        workspaces={},
        lanes=False,
        queue=cast(Any, None),
        signing_key=b"k",
    )
    clock = Clock()
    state.seen = Tickets(clock=clock)
    assert state.first_sight(5, remaining_ms=30_000)
    clock.now += 30 + TICKET_MARGIN_S - 1  # past its deadline, within the margin
    assert not state.first_sight(5, remaining_ms=-1)
    clock.now += 1
    assert state.first_sight(6, remaining_ms=30_000)
    assert len(state.seen) == 1  # 5 is forgotten: a redelivery now is dropped as expired
    state.reincarnate("j")
    assert len(state.seen) == 0
