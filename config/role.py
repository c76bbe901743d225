"""Which kind of Sluice process this is, decided by manage.py before Django reads the settings.

A worker (`manage.py runworker`) runs on a user's machine: it signs nothing with SECRET_KEY
and never opens Postgres, so it is given neither (contract §4.4). Everything else (the API,
operator commands) is a server process.
"""

from __future__ import annotations

WORKER = False


def mark_worker() -> None:
    global WORKER
    WORKER = True
