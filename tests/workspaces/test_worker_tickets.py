"""The tickets a worker has run (workspaces/runtime/state.py `Tickets`): a redelivery is
refused while its ticket is remembered, memory holds only the last `remember_s` of tickets,
and a look costs the same however many are remembered. A fake clock; no Redis needed."""

from __future__ import annotations

from workspaces.runtime.state import Tickets


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_redelivery_is_refused_while_its_ticket_is_remembered() -> None:
    clock = Clock()
    tickets = Tickets(remember_s=60, clock=clock)
    assert tickets.first_sight(7)
    clock.now += 59.9
    assert not tickets.first_sight(7)
    assert tickets.first_sight(8)
    assert not tickets.first_sight(8)


def test_tickets_are_forgotten_oldest_first_after_their_time() -> None:
    clock = Clock()
    tickets = Tickets(remember_s=60, clock=clock)
    for ticket in range(100):
        assert tickets.first_sight(ticket)
        clock.now += 1.0
    # Now 1100: tickets first seen at 1040 or before (0..40) have had their 60 s.
    assert tickets.first_sight(1000)
    assert len(tickets) == 60  # 41..99 and 1000
    assert not tickets.first_sight(41)  # first seen at 1041: remembered until 1101
    assert tickets.first_sight(0)  # forgotten: seen as new (a redelivery this late is expired)


def test_a_look_costs_the_same_however_many_tickets_are_remembered() -> None:
    clock = Clock()
    tickets = Tickets(remember_s=1250, clock=clock)
    # 1,250 s at 4 calls/s: 5,000 remembered (an hour at 100 calls/s would be 360,000).
    for ticket in range(5_000):
        tickets.first_sight(ticket)
        clock.now += 0.25
    before = tickets.examined
    for ticket in range(5_000, 6_000):
        assert tickets.first_sight(ticket)
        clock.now += 0.25
    # Each look forgets the ticket that expired since the last (one a call in the steady
    # state) and stops at the first remembered: a scan of them all would be 5,000 a look.
    assert tickets.examined - before <= 2 * 1000
    assert len(tickets) == 5_000


def test_clear_forgets_every_ticket() -> None:
    tickets = Tickets(remember_s=60, clock=Clock())
    tickets.first_sight(1)
    tickets.clear()
    assert len(tickets) == 0
    assert tickets.first_sight(1)
